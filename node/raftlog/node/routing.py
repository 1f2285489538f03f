"""Which partition a key belongs to: CRC32C of the key's bytes, modulo the partition count.

Clients and nodes compute it the same way, so a keyed record always lands in one partition and
the latest value per key is in one keyed table. A key's bytes come from JSON the same way on
both sides too (`field_bytes`): `key` as UTF-8, or `key_b64` decoded.
"""

from __future__ import annotations

import base64
import binascii

from crc32c import crc32c


def partition_for(key: bytes, partitions: int) -> int:
    if partitions < 1:
        raise ValueError(f"partitions: must be at least 1, got {partitions}")
    return crc32c(key) % partitions


class FieldError(ValueError):
    """A record's field that cannot be taken: `field` names it, `reason` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def field_bytes(text: object, b64: object, field: str) -> bytes | None:
    """The bytes of `field` given as `text` (UTF-8) or `<field>_b64` (base64), None when both
    are absent, or FieldError."""
    name = field.rpartition(".")[2]
    if b64 is not None:
        if text is not None:
            raise FieldError(field, f"give {name} or {name}_b64, not both")
        if not isinstance(b64, str):
            raise FieldError(f"{field}_b64", "must be a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):  # ValueError: text that is not ASCII
            raise FieldError(f"{field}_b64", "is not valid base64") from None
    if text is None:
        return None
    if not isinstance(text, str):
        raise FieldError(field, "must be a string or null")  # the node's msgspec reason
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate
        raise FieldError(field, "is not valid Unicode text") from None

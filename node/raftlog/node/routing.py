"""Which partition a key belongs to: CRC32C of the key's bytes, modulo the partition count.

Clients and nodes compute it the same way, so a keyed record always lands in one partition and
the latest value per key is in one keyed table.
"""

from __future__ import annotations

from crc32c import crc32c


def partition_for(key: bytes, partitions: int) -> int:
    if partitions < 1:
        raise ValueError(f"partitions: must be at least 1, got {partitions}")
    return crc32c(key) % partitions

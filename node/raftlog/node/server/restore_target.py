"""What a restore is asked to reach, and what a backup may be named: parsed and checked (no
I/O), for the node's restore, `raftctl`, the operator's models and `kubectl raft`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from raftlog.node.record import epoch_ms


@dataclass(frozen=True)
class Target:
    """What to restore to: `latest` archived; an `index` (one for every partition, or one per
    partition); the last record before a `time` (epoch ms); a `backup` by name."""

    kind: str
    index: int | None = None
    indexes: dict[int, int] | None = None
    time_ms: int | None = None
    backup: str | None = None

    def describe(self) -> str:
        if self.kind == "index":
            if self.indexes is not None:
                return "index " + ",".join(f"{p}={i}" for p, i in sorted(self.indexes.items()))
            return f"index {self.index}"
        if self.kind == "time":
            assert self.time_ms is not None
            return f"time {datetime.fromtimestamp(self.time_ms / 1000, UTC).isoformat()}"
        if self.kind == "backup":
            return f"backup {self.backup}"
        return "latest"


def parse_target(text: str) -> Target:
    """`latest`, `index:N`, `index:0=N,1=M`, `time:<ISO 8601 with zone>|<epoch ms>`,
    `backup:<name>`; a ValueError names what is wrong."""
    kind, _, value = text.partition(":")
    if kind == "latest" and not value:
        return Target("latest")
    if kind == "index" and value:
        if "=" not in value:
            return Target("index", index=_non_negative("index", value))
        indexes: dict[int, int] = {}
        for part in value.split(","):
            p, _, i = part.partition("=")
            indexes[_non_negative("partition", p)] = _non_negative("index", i)
        return Target("index", indexes=indexes)
    if kind == "time" and value:
        return Target("time", time_ms=parse_time_ms(value))
    if kind == "backup" and value:
        check_backup_name(value)
        return Target("backup", backup=value)
    raise ValueError(
        f"target {text!r}: give latest, index:N, index:P=N,..., time:<ISO time or epoch ms>, "
        "or backup:<name>"
    )


def parse_time_ms(value: str) -> int:
    if value.isdigit():
        return int(value)
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"time {value!r}: not an ISO 8601 time nor milliseconds") from None
    if t.tzinfo is None:
        raise ValueError(f"time {value!r}: give a zone (Z or +hh:mm): a restore point is exact")
    return epoch_ms(t)


def _non_negative(name: str, v: str) -> int:
    if not v.strip().isdigit():
        raise ValueError(f"{name} {v!r}: not a non-negative integer")
    return int(v)


BACKUP_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")


def check_backup_name(name: str) -> None:
    if not name or len(name) > 128 or not set(name) <= BACKUP_NAME_CHARS or name[0] in ".-":
        raise ValueError(
            f"backup name {name!r}: 1 to 128 of a-z, 0-9, '-', '.', '_', not starting with . or -"
        )

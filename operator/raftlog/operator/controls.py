"""Day-2 requests made through the `RaftCluster`'s annotations, parsed once for the reconciler,
the handlers and `kubectl raft`.

Annotations carry what is a request rather than a state of the cluster (as Strimzi's
`strimzi.io/pause-reconciliation` and CloudNativePG's `kubectl.kubernetes.io/restartedAt`):
changing one is not a spec change, so it never rolls a member by itself. What is a state the
cluster should be in (fenced members, hibernation, which members a scale-down removes) is in
the spec, where the API server checks it.

- `raftlog.dev/pause-reconciliation: "true"`: the operator does nothing to the cluster (no pod,
  volume, membership or leadership change, no shared object applied); its status says so.
- `raftlog.dev/restartedAt: <any text, by convention an RFC 3339 time>`: a new value restarts
  every member once, quorum-safe, leaders last (the value is part of the launch configuration).
- `raftlog.dev/switchover: <member>[:<p>,<p>...][@<id>]`: move the leadership of the listed
  partitions (all of them if none are listed) to that member. Each distinct value is one request,
  carried out once and recorded in `status.switchover`; `@<id>` lets the same move be asked again.
- `raftlog.dev/backup: <name>`: a backup named so (every partition archived up to what it has
  committed, recorded in the archive); each name is taken once, recorded in `status.backups`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from raftlog.node.server.restore_target import check_backup_name

PAUSE = "raftlog.dev/pause-reconciliation"
RESTART = "raftlog.dev/restartedAt"
SWITCHOVER = "raftlog.dev/switchover"
BACKUP = "raftlog.dev/backup"

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0", "")
_MEMBER = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# A partition number of at most 9 digits: Python's int() refuses more than 4,300, and a
# ValueError here ended the reconcile daemon on every start.
_PARTITION = r"[0-9]{1,9}"
_SWITCHOVER = re.compile(
    rf"^(?P<member>{_MEMBER})(:(?P<partitions>{_PARTITION}(,{_PARTITION})*))?(@.*)?$"
)


@dataclass(frozen=True)
class SwitchoverRequest:
    request: str  # the annotation's whole value: the identity of the request
    target: str
    partitions: tuple[int, ...] | None  # None: every partition


@dataclass(frozen=True)
class Controls:
    paused: bool = False
    restart: str | None = None
    switchover: SwitchoverRequest | None = None
    backup: str | None = None  # the name of the backup asked for
    problems: tuple[str, ...] = ()  # annotations that could not be read, each with its reason


NONE = Controls()  # no annotation asks for anything


def parse(annotations: Mapping[str, str] | None) -> Controls:
    """The controls the annotations ask for; a value that cannot be read is named in
    `problems` with the reason, and asks for nothing."""
    annotations = annotations or {}
    problems: list[str] = []
    paused = False
    raw = annotations.get(PAUSE)
    if raw is not None:
        value = raw.strip().lower()
        if value in _TRUE:
            paused = True
        elif value not in _FALSE:
            problems.append(f'{PAUSE}: "{raw}" is neither "true" nor "false"')
    restart = annotations.get(RESTART) or None
    switchover = None
    raw = annotations.get(SWITCHOVER)
    if raw:
        match = _SWITCHOVER.match(raw.strip())
        if match is None:
            problems.append(
                f'{SWITCHOVER}: "{raw}" is not <member>[:<partition>,...][@<id>] '
                '(for example "demo-1" or "demo-1:0,2")'
            )
        else:
            listed = match.group("partitions")
            partitions = tuple(sorted({int(p) for p in listed.split(",")})) if listed else None
            switchover = SwitchoverRequest(raw.strip(), match.group("member"), partitions)
    backup = None
    raw = annotations.get(BACKUP)
    if raw:
        try:
            check_backup_name(raw.strip())
            backup = raw.strip()
        except ValueError as e:
            problems.append(f"{BACKUP}: {e}")
    return Controls(paused, restart, switchover, backup, tuple(problems))

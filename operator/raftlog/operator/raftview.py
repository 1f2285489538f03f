"""What `kubectl raft status` shows of a `RaftCluster`: a view of its status, as JSON and as text.

Pure functions of the resource (a dict as the API server returns it): no I/O, so the layout is
unit-tested. The JSON view is the stable interface for scripts (`kubectl raft status -o json`);
its keys, all camelCase:

- `name`, `namespace`, `phase`, `generation`, `observedGeneration`, `lastAction`;
- `desiredReplicas` (spec.replicas), `replicas` (members, removing ones left out),
  `readyReplicas`, `desiredPartitions` (spec.partitions);
- `paused` (the raftlog.dev/pause-reconciliation annotation asks for a pause), `hibernate`
  (spec.hibernate), `restartRequested` (the raftlog.dev/restartedAt annotation) and `restartedAt`
  (the value every member has been restarted for, from the status);
- `conditions`: every condition of the status (`type`, `status`, `reason`, `message`,
  `lastTransitionTime`); `notable`: the types of those worth a look (`notable_conditions`);
- `members`: `name`, `role`, `ready`, `fenced` (stopped as fenced), `fenceRequested` (listed
  in spec.fencedMembers), `removeRequested` (listed in spec.removeMembers), `leaderships`
  (partitions it leads), `promotion`: a learner's catch-up (`maxLag`: its largest lag over
  its partitions, in entries, null when unknown; `windowSeconds`, `elapsedSeconds`: its
  promotion window) or null;
- `partitions`: `partition`, `leader` (null: none known), `members`: per member reporting the
  partition, `lag`, `state`, `snapshotRequired`;
- `snapshotInstalls`: `member`, `partition`, `source`, `state`, `attempts`, `lastError`,
  `bytesDone` and `bytesTotal` (how far its stream is, as last reported; null before);
- `switchover`: the status' record of the latest request (`request`, `target`, `partitions`,
  `state`, `message`) or null; `switchoverRequested`: the annotation's value or null;
- `volumeExpansion`: the latest volume expansion (`size`, `state`, `message`) or null;
- `problems`: what the operator was asked and cannot act on, and an archive that fails, each
  with the reason (they are in the Degraded condition's message too);
- `archive`, only when the cluster archives (spec.archive): `url`, and `partitions`: per
  partition `partition`, `archivedIndex`, `lagEntries`, `lastError` (the leader's, null when
  its last pass worked), `failingOn` (members whose last pass failed), `lastUploadAt` (epoch
  seconds or null), `reportedBy` (the leader);
- `restore`: where the cluster came back from (spec.restore) or null: `url`, `target`, `state`
  (planning, planned, failed), `partitions` (`partition`, `index`: where each came back),
  `message` (why the plan failed), `at` (epoch seconds);
- `backups`: the status' backups, oldest first (the operator keeps the last 20): `name`,
  `scheduled`, `state` (pending, done, failed), `requestedAt`, `finishedAt` (epoch seconds),
  `partitions` (`partition`, `index`: what each is archived up to), `message`;
  `backupRequested`: the raftlog.dev/backup annotation's value or null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from raftlog.operator import controls
from raftlog.operator.models import Condition, RaftClusterStatus

# Conditions shown when True; `Available` is shown when it is not True.
NOTABLE_WHEN_TRUE = ("Degraded", "Paused", "Hibernated", "Progressing")
SNAPSHOT_MARK = "*"
BACKUPS_SHOWN = 5  # in the text; -o json has every one the status keeps


def notable_conditions(conditions: Sequence[Condition]) -> list[Condition]:
    """The conditions a person should see: Available when not True, and Degraded, Paused,
    Hibernated, Progressing when True (Available=True and the False ones are the quiet case)."""
    return [
        c
        for c in conditions
        if (c.type == "Available" and c.status != "True")
        or (c.type in NOTABLE_WHEN_TRUE and c.status == "True")
    ]


def _partition_numbers(status: RaftClusterStatus, desired: int | None) -> list[int]:
    seen = {int(p) for p in status.leaders if p.isdigit()}
    seen |= {mp.partition for m in status.members for mp in m.partitions}
    if desired:
        seen |= set(range(desired))
    return sorted(seen)


def view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON view of a RaftCluster (see the module's docstring for its keys)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = RaftClusterStatus.model_validate(obj.get("status") or {})
    asked = controls.parse(meta.get("annotations"))
    fenced_spec = set(spec.get("fencedMembers") or [])
    remove_spec = set(spec.get("removeMembers") or [])
    desired_partitions = spec.get("partitions")
    leads: dict[str, int] = {}
    for leader in status.leaders.values():
        leads[leader] = leads.get(leader, 0) + 1
    partitions = []
    for p in _partition_numbers(status, desired_partitions):
        cells = {}
        for m in status.members:
            mp = next((x for x in m.partitions if x.partition == p), None)
            if mp is not None:
                cells[m.name] = {
                    "lag": mp.lag,
                    "state": mp.state,
                    "snapshotRequired": mp.snapshot_required,
                }
        partitions.append({"partition": p, "leader": status.leaders.get(str(p)), "members": cells})
    switchover = status.switchover
    out: dict[str, Any] = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "phase": status.phase,
        "generation": meta.get("generation"),
        "observedGeneration": status.observed_generation,
        "lastAction": status.last_action,
        "desiredReplicas": spec.get("replicas"),
        "replicas": status.replicas,
        "readyReplicas": status.ready_replicas,
        "desiredPartitions": desired_partitions,
        "paused": asked.paused,
        "hibernate": bool(spec.get("hibernate", False)),
        "restartRequested": asked.restart,
        "restartedAt": status.restarted_at,
        "conditions": [
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": c.last_transition_time,
            }
            for c in status.conditions
        ],
        "notable": [c.type for c in notable_conditions(status.conditions)],
        "members": [
            {
                "name": m.name,
                "role": m.role,
                "ready": m.ready,
                "fenced": m.fenced,
                "fenceRequested": m.name in fenced_spec,
                "removeRequested": m.name in remove_spec,
                "leaderships": leads.get(m.name, 0),
                "promotion": None
                if m.promotion is None or m.role != "learner"
                else {
                    "maxLag": m.promotion.max_lag,
                    "windowSeconds": m.promotion.window_seconds,
                    "elapsedSeconds": m.promotion.elapsed_seconds,
                },
            }
            for m in status.members
        ],
        "partitions": partitions,
        "snapshotInstalls": [
            {
                "member": i.member,
                "partition": i.partition,
                "source": i.source,
                "state": i.state,
                "attempts": i.attempts,
                "lastError": i.last_error,
                "bytesDone": i.bytes_done,
                "bytesTotal": i.bytes_total,
            }
            for i in status.snapshot_installs
        ],
        "switchover": None
        if switchover is None
        else {
            "request": switchover.request,
            "target": switchover.target,
            "partitions": switchover.partitions,
            "state": switchover.state,
            "message": switchover.message,
        },
        "switchoverRequested": asked.switchover.request if asked.switchover else None,
        "volumeExpansion": None
        if status.volume_expansion is None
        else {
            "size": status.volume_expansion.size,
            "state": status.volume_expansion.state,
            "message": status.volume_expansion.message,
        },
        "problems": list(status.problems),
        "restore": None
        if status.restore is None
        else {
            "url": status.restore.url,
            "target": status.restore.target,
            "state": status.restore.state,
            "partitions": _indexes(status.restore.partitions),
            "message": status.restore.message,
            "at": status.restore.at,
        },
        "backups": [
            {
                "name": b.name,
                "scheduled": b.scheduled,
                "state": b.state,
                "requestedAt": b.requested_at,
                "finishedAt": b.finished_at,
                "partitions": _indexes(b.partitions),
                "message": b.message,
            }
            for b in status.backups
        ],
        "backupRequested": asked.backup,
    }
    if status.archive is not None or spec.get("archive"):
        out["archive"] = _archive_view(status, spec)
    return out


def _indexes(parts: Sequence[Any]) -> list[dict[str, int]]:
    return [{"partition": p.partition, "index": p.index} for p in parts]


def _archive_view(status: RaftClusterStatus, spec: Mapping[str, Any]) -> dict[str, Any]:
    archive = status.archive
    return {
        "url": archive.url if archive else (spec.get("archive") or {}).get("url"),
        "partitions": [
            {
                "partition": a.partition,
                "archivedIndex": a.archived_index,
                "lagEntries": a.lag_entries,
                "lastError": a.last_error,
                "failingOn": list(a.failing_on),
                "lastUploadAt": a.last_upload_at,
                "reportedBy": a.reported_by,
            }
            for a in (archive.partitions if archive else [])
        ],
    }


# ----------------------------------------------------------------------------- text


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns left-aligned, three spaces apart (kubectl's look); no trailing spaces."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    return [
        "   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    ]


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _fenced(member: Mapping[str, Any]) -> str:
    if member["fenced"]:
        return "yes" if member["fenceRequested"] else "yes, lifting"
    return "requested" if member["fenceRequested"] else "no"


def _cell(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return "-"
    if cell["state"] == "leader":
        return "leader"
    lag = "?" if cell["lag"] is None else str(cell["lag"])
    text = f"{lag}/{cell['state'] or '?'}"
    return text + SNAPSHOT_MARK if cell["snapshotRequired"] else text


def _role(member: Mapping[str, Any]) -> str:
    text = str(member["role"])
    promotion = member["promotion"]
    if promotion is not None:  # a learner catching up
        lag = "?" if promotion["maxLag"] is None else str(promotion["maxLag"])
        window = f"{promotion['elapsedSeconds']:.1f}/{promotion['windowSeconds']:g} s"
        text += f" (lag {lag}, window {window})"
    return text + (" (remove requested)" if member["removeRequested"] else "")


UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def progress(done: int | None, total: int | None) -> str:
    """`12.3/40.0 MiB (30%)`: bytes done of total in the total's unit, the percentage rounded
    down (100% only when done); `-` when not known."""
    if done is None or total is None:
        return "-"
    percent = 100 if done >= total else done * 100 // total
    for unit, size in UNITS:
        if total >= size:
            return f"{done / size:.1f}/{total / size:.1f} {unit} ({percent}%)"
    return f"{done}/{total} B ({percent}%)"


def _switchover_line(v: Mapping[str, Any]) -> str | None:
    sw, asked = v["switchover"], v["switchoverRequested"]
    if asked is not None and (sw is None or sw["request"] != asked):
        return f"Switchover {asked}: requested, not picked up by the operator yet"
    if sw is None:
        return None
    listed = sw["partitions"]
    if listed is None:
        where = "every partition"
    else:
        where = ("partition " if len(listed) == 1 else "partitions ") + ",".join(map(str, listed))
    line = f"Switchover {sw['request']}: to {sw['target']}, {where}: {sw['state']}"
    return line + (f" ({sw['message']})" if sw["message"] else "")


def render(v: Mapping[str, Any]) -> str:
    """`kubectl raft status NAME`: the view as text."""
    members = v["members"]
    replicas = f"{v['readyReplicas']}/{v['replicas']} members ready"
    if v["desiredReplicas"] is not None and v["desiredReplicas"] != v["replicas"]:
        replicas += f" (spec: {v['desiredReplicas']})"
    lines = [
        f"RaftCluster {v['namespace']}/{v['name']}: {v['phase']}, {replicas}, "
        f"{len(v['partitions'])} partitions"
    ]
    if v["observedGeneration"] is None:  # no operator has written a status yet
        lines.append(
            f"  no operator has reconciled it yet: is one running, and watching namespace "
            f"{v['namespace']}? (the chart's watch.namespaces, or raftlog-operator -n/-A)"
        )
    shown = [c for c in v["conditions"] if c["type"] in v["notable"]]
    for c in shown:
        text = f"  {c['type']}={c['status']} {c['reason']}"
        lines.append(text + (f": {c['message']}" if c["message"] else ""))
    if v["paused"] and "Paused" not in v["notable"]:
        lines.append("  pause requested (raftlog.dev/pause-reconciliation), not in effect yet")
    if v["restartRequested"] and v["restartRequested"] != v["restartedAt"]:
        lines.append(f"  restart {v['restartRequested']} requested, under way")
    expansion = v["volumeExpansion"]
    if expansion is not None and expansion["state"] == "requested":
        lines.append(f"  volumes expanding to {expansion['size']}")
    if v["lastAction"] not in ("", "steady") and all(
        c["message"] != v["lastAction"] for c in shown
    ):
        lines.append(f"  last action: {v['lastAction']}")

    lines.append("")
    if members:
        lines += table(
            ["MEMBER", "ROLE", "READY", "FENCED", "LEADERSHIPS"],
            [
                [
                    m["name"],
                    _role(m),
                    _yes(m["ready"]),
                    _fenced(m),
                    str(m["leaderships"]),
                ]
                for m in members
            ],
        )
    else:
        lines.append("No members yet.")

    if v["partitions"]:
        names = [m["name"] for m in members]
        lines.append("")
        lines += table(
            ["PARTITION", "LEADER", *names],
            [
                [str(p["partition"]), p["leader"] or "none"]
                + [_cell(p["members"].get(n)) for n in names]
                for p in v["partitions"]
            ],
        )
        marked = any(c["snapshotRequired"] for p in v["partitions"] for c in p["members"].values())
        lines.append(
            "(each member: lag/progress state"
            + (f"; {SNAPSHOT_MARK} SnapshotRequired" if marked else "")
            + ")"
        )

    if v["snapshotInstalls"]:
        lines += ["", "Snapshot installs (pending, then the most recent):"]
        lines += table(
            ["MEMBER", "PARTITION", "SOURCE", "STATE", "PROGRESS", "ATTEMPTS", "LAST ERROR"],
            [
                [
                    i["member"],
                    str(i["partition"]),
                    i["source"],
                    i["state"],
                    progress(i["bytesDone"], i["bytesTotal"]),
                    str(i["attempts"]),
                    i["lastError"] or "-",
                ]
                for i in v["snapshotInstalls"]
            ],
        )

    archive = v.get("archive")
    if archive is not None:
        lines += ["", f"Archive to {archive['url']}:"]
        if archive["partitions"]:
            lines += table(
                ["PARTITION", "ARCHIVED", "LAG", "LAST ERROR"],
                [
                    [
                        str(a["partition"]),
                        str(a["archivedIndex"]),
                        str(a["lagEntries"]),
                        _archive_error(a),
                    ]
                    for a in archive["partitions"]
                ],
            )
        else:
            lines.append("no member has reported its archive yet")

    lines += _restore_lines(v)
    lines += _backup_lines(v)

    switchover = _switchover_line(v)
    if switchover:
        lines += ["", switchover]
    return "\n".join(lines) + "\n"


def at_indexes(parts: Sequence[Mapping[str, int]]) -> str:
    """`0@120,1@98`: partition@index."""
    return ",".join(f"{p['partition']}@{p['index']}" for p in parts) or "-"


def utc(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _restore_lines(v: Mapping[str, Any]) -> list[str]:
    r = v["restore"]
    if r is None:
        return []
    line = f"Restored from {r['url']} ({r['target']}): {r['state']}"
    if r["state"] == "planned":
        line += f", partition@index {at_indexes(r['partitions'])}"
    elif r["message"]:
        line += f" ({r['message']})"
    return ["", line]


def _backup_lines(v: Mapping[str, Any]) -> list[str]:
    backups, asked = v["backups"], v["backupRequested"]
    lines = []
    if backups:
        shown = backups[-BACKUPS_SHOWN:]
        more = f", the last {len(shown)} of {len(backups)}" if len(shown) < len(backups) else ""
        lines += ["", f"Backups (oldest first{more}):"]
        lines += table(
            ["NAME", "STATE", "REQUESTED", "PARTITION@INDEX"],
            [
                [
                    b["name"],
                    b["state"],
                    utc(b["requestedAt"]),
                    b["message"] or "-" if b["state"] == "failed" else at_indexes(b["partitions"]),
                ]
                for b in shown
            ],
        )
    if asked is not None and all(b["name"] != asked for b in backups):
        lines += ["", f"Backup {asked}: requested, not picked up by the operator yet"]
    return lines


def _archive_error(a: Mapping[str, Any], chars: int = 80) -> str:
    failing = [n for n in a["failingOn"] if n != a["reportedBy"]]
    text = a["lastError"] or ("-" if not failing else "")
    if len(text) > chars:
        text = text[: chars - 3] + "..."
    if failing:
        text += ("; " if a["lastError"] else "") + f"failing on {', '.join(failing)}"
    return text


def render_list(views: Sequence[Mapping[str, Any]], all_namespaces: bool) -> str:
    """`kubectl raft status` without a name: one line per RaftCluster."""
    if not views:
        return "No RaftClusters found.\n"
    header = ["NAME", "PHASE", "READY", "PARTITIONS", "LEADERS", "NOTES"]
    rows = []
    for v in views:
        leaders = [p["leader"] or "none" for p in v["partitions"]]
        notes = [
            c["type"] + ("" if c["type"] == "Progressing" else f" ({c['reason']})")
            for c in v["conditions"]
            if c["type"] in v["notable"]
        ]
        rows.append(
            [
                v["name"],
                v["phase"],
                f"{v['readyReplicas']}/{v['replicas']}",
                str(len(v["partitions"])),
                _compact(leaders),
                ", ".join(notes) or "-",
            ]
        )
    if all_namespaces:
        header = ["NAMESPACE", *header]
        rows = [[v["namespace"], *row] for v, row in zip(views, rows, strict=True)]
    return "\n".join(table(header, rows)) + "\n"


def _compact(leaders: list[str], shown: int = 3) -> str:
    if not leaders:
        return "-"
    if len(leaders) <= shown:
        return ",".join(leaders)
    return ",".join(leaders[:shown]) + f",+{len(leaders) - shown}"

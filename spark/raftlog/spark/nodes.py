"""What the data source asks of the nodes, through the node API's blocking client.

Spark calls the reader from its own Python workers, one call at a time, so `raftlog.client`'s
blocking `Client` (a kept-alive connection per node, no event loop) is the simplest fast thing.
Every call has a timeout; every retry loop a deadline and a bounded back-off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftlog.client import Client, ClientError, RetryPolicy
from raftlog.spark.options import OptionError, Options

if TYPE_CHECKING:
    from raftlog.spark.archived import Tier


class DataLoss(Exception):
    """Records the read needs were compacted away on every replica."""


def rounds(options: Options) -> RetryPolicy:
    """How a task tries again what no node would serve yet (an append, a round over a split's
    replicas): for up to `timeoutSeconds`, pausing at most a second between tries, since a
    task that waits longer only finishes later once a replica is back."""
    return RetryPolicy(retries=None, within_s=options.timeout_s, cap_s=1.0)


def client(options: Options) -> Client:
    """A client of the nodes `options` name; close it when the task is done with it."""
    return Client(
        options.endpoints,
        token=options.token,
        ca_file=options.ca_file,
        timeout_s=options.timeout_s,
        retry=rounds(options),
    )


@dataclass(frozen=True)
class Replica:
    url: str
    leader: bool
    high_water_mark: int
    floor: int  # the first index this replica still has in its log
    # The lowest index it serves: below its floor from the cluster's archive (the node's tiered
    # reads), else its floor.
    readable_from: int = 0

    def __post_init__(self) -> None:
        if not self.readable_from:
            object.__setattr__(self, "readable_from", self.floor)


@dataclass
class PartitionView:
    partition: int
    replicas: list[Replica] = field(default_factory=list)
    # What the archive holds of the partition (with archiveUrl, once read: `archived.attach`).
    tier: Tier | None = None

    @property
    def high_water_mark(self) -> int:
        """The highest committed index any answering replica knows (each is committed)."""
        return max((r.high_water_mark for r in self.replicas), default=0)

    @property
    def floor(self) -> int:
        """The lowest index some replica still has (the partition's compaction floor)."""
        return min((r.floor for r in self.replicas), default=1)

    @property
    def readable_from(self) -> int:
        """The lowest index some replica serves (its floor, or lower with tiered reads)."""
        return min((r.readable_from for r in self.replicas), default=1)

    @property
    def earliest(self) -> int:
        """The lowest index still readable: with this reader's archive (archiveUrl), the floor
        or that archive's first index below it (what is below the floor is read from there);
        without, what the nodes serve (their floor, or their own archive's first index)."""
        if self.tier is not None:
            first = self.tier.first
            return self.floor if first is None else min(self.floor, first)
        return min(self.floor, self.readable_from)

    def read_order(self, prefer_followers: bool, rotate: int = 0) -> list[str]:
        """Replicas to read from, best first: followers first when `prefer_followers` (spread
        over splits by `rotate`), the leader first otherwise."""
        followers = [r.url for r in self.replicas if not r.leader]
        leaders = [r.url for r in self.replicas if r.leader]
        if followers:
            k = rotate % len(followers)
            followers = followers[k:] + followers[:k]
        return followers + leaders if prefer_followers else leaders + followers


def index_for_time(nodes: Client, view: PartitionView, t: int) -> tuple[int | None, bool]:
    """The first committed index of `view`'s partition stamped at or after `t` (ms), or None
    when there is none, and whether a record at or after `t` may have been compacted before it.
    Asked of the replica holding the most first (the lowest floor), never of one whose mark is
    below the planned one (it answers 503 `behind`); ClientError when no replica answers."""
    last: ClientError | None = None
    for r in sorted(view.replicas, key=lambda r: (r.floor, -r.high_water_mark)):
        try:
            answer = nodes.index_for_time(r.url, view.partition, t, min_index=view.high_water_mark)
        except ClientError as e:
            if not e.retryable:
                raise
            last = e
            continue
        index = answer.get("index")
        return (None if index is None else int(index)), bool(answer.get("compacted"))
    assert last is not None
    raise last


@dataclass
class ClusterView:
    partitions: dict[int, PartitionView]
    unreachable: dict[str, str]  # endpoint -> why


def survey(nodes: Client, opts: Options, timeout: float | None = None) -> ClusterView:
    """Every endpoint's status; OptionError naming `endpoints` when none answers."""
    timeout = min(opts.timeout_s, 10.0) if timeout is None else timeout
    views: dict[int, PartitionView] = {}
    unreachable: dict[str, str] = {}
    clusters: set[str] = set()
    for base in opts.endpoints:
        try:
            st = nodes.status(base, timeout_s=timeout)
        except ClientError as e:
            unreachable[base] = str(e)
            continue
        parts = st.get("partitions", [])
        if st.get("cluster"):
            clusters.add(str(st["cluster"]))
        for p in parts:
            view = views.setdefault(int(p["partition"]), PartitionView(int(p["partition"])))
            view.replicas.append(
                Replica(
                    base,
                    p.get("role") == "leader",
                    int(p["high_water_mark"]),
                    int(p["compaction_floor"]),
                    int(p.get("readable_from") or 0),
                )
            )
    if not views:
        why = "; ".join(unreachable.values())  # each names its endpoint
        raise OptionError("endpoints", f"no node answered /v1/status ({why})")
    # Members may hold different numbers of partitions while a raise rolls through them: a
    # partition is read from those that hold it (refusing stopped every query for the raise).
    if len(clusters) > 1:
        raise OptionError(
            "endpoints", f"the nodes are members of different clusters {sorted(clusters)}"
        )
    if opts.partitions is not None:
        missing = [p for p in opts.partitions if p not in views]
        if missing:
            raise OptionError(
                "partitions", f"{missing} do not exist (the cluster has 0..{len(views) - 1})"
            )
        views = {p: views[p] for p in opts.partitions}
    return ClusterView(views, unreachable)

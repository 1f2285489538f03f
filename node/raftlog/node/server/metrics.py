"""`/metrics`: Prometheus metrics of a node, prefixed `raftlog_`.

State (terms, marks, lag, counters kept by the drivers) is read at scrape time by a collector,
so nothing is updated on the hot path but the two latency histograms: fsync and requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftlog.node.core.raft import Role

if TYPE_CHECKING:
    from raftlog.node.server.node import Node

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.fsync = Histogram(
            "raftlog_fsync_seconds",
            "Time of one sync of the node's journal (one group commit of every partition)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Histogram(
            "raftlog_request_seconds",
            "Time to answer an HTTP request",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "raftlog_connections_refused",
            "Connections answered 503 and closed because their listener was full",
            ["listener"],
            registry=self.registry,
        )
        self.peer_streams_timed_out = Counter(
            "raftlog_peer_streams_timed_out",
            "Peer frame streams closed because a frame begun was not complete within "
            "peer_frame_timeout_s",
            registry=self.registry,
        )
        self.peer_messages_dropped = Counter(
            "raftlog_peer_messages_dropped",
            "Messages from peers dropped because they are for a partition this node does not have",
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, int], Histogram] = {}
        self._fsync_children: dict[int, Histogram] = {}

    def request_latency(self, route: str, method: str, status: int) -> Histogram:
        """The `requests` child of these labels, looked up once (`labels` costs a lock and a
        few allocations per call, on every request)."""
        key = (route, method, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(route, method, str(status))
        return child

    def attach(self, node: Node) -> None:
        self.registry.register(_StateCollector(node))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"raftlog_{name}", doc, labels=labels or ["partition"])

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"raftlog_{name}", doc, labels=["partition"])

        term = gauge("term", "Current term")
        leader = gauge("is_leader", "1 on the partition's leader")
        hwm = gauge("high_water_mark", "Commit index: readers never pass it")
        applied = gauge("applied_index", "Last entry applied to the keyed table")
        last = gauge("last_index", "Last entry in the log")
        floor = gauge("compaction_floor", "First index still in the WAL")
        snap = gauge("snapshot_index", "Last index covered by the durable snapshot")
        failed = gauge(
            "partition_failed",
            "1 when the partition stopped writing (disk fault, or a driver failure)",
        )
        lag = gauge("follower_lag", "Leader commit minus follower match", ["partition", "follower"])
        required = gauge(
            "follower_snapshot_required",
            "1 while a follower needs a snapshot (its next entry is compacted)",
            ["partition", "follower"],
        )
        streamed = gauge(
            "snapshot_send_sent_bytes",
            "Bytes of a snapshot being streamed that its target holds (while it streams)",
            ["partition", "target"],
        )
        streaming = gauge(
            "snapshot_send_size_bytes",
            "Size of a snapshot being streamed (while it streams)",
            ["partition", "target"],
        )
        elections = counter("elections", "Elections won by this node")
        rounds = counter("backfill_rounds", "Bounded backfill rounds sent")
        entries = counter("backfill_entries", "Entries sent in backfill rounds")
        installed = counter("snapshot_installs", "Snapshots installed on this node")
        sent = counter("snapshots_sent", "Snapshots streamed to followers")
        sent_bytes = counter("snapshot_sent_bytes", "Bytes of snapshots streamed")
        for p, d in self.node.drivers.items():
            lp = [str(p)]
            st = d.raft.status()
            term.add_metric(lp, st.term)
            leader.add_metric(lp, 1 if st.role == Role.LEADER else 0)
            hwm.add_metric(lp, st.high_water_mark)
            applied.add_metric(lp, st.applied)
            last.add_metric(lp, st.last_index)
            floor.add_metric(lp, d.storage.compaction_floor())
            snap.add_metric(lp, d.storage.snapshot_meta().index)
            failed.add_metric(lp, 1 if d.failed else 0)
            for f in st.followers.values():
                if f.lag is not None:
                    lag.add_metric([str(p), f.node], f.lag)
                required.add_metric([str(p), f.node], 1 if f.snapshot_required else 0)
            for send in self.node.transport.snapshot_sends_of(p):
                streamed.add_metric([str(p), send.target], send.sent_bytes)
                streaming.add_metric([str(p), send.target], send.total_bytes)
            c = d.counters
            elections.add_metric(lp, c.elections)
            rounds.add_metric(lp, c.backfill_rounds)
            entries.add_metric(lp, c.backfill_entries)
            installed.add_metric(lp, c.snapshots_installed)
            sent.add_metric(lp, c.snapshots_sent)
            sent_bytes.add_metric(lp, c.snapshot_bytes_sent)
        yield from (term, leader, hwm, applied, last, floor, snap, failed, lag, required)
        yield from (streamed, streaming)
        yield from (elections, rounds, entries, installed, sent, sent_bytes)
        insecure = GaugeMetricFamily(
            "raftlog_insecure_no_auth", "1 when the node runs without a token (insecure_no_auth)"
        )
        insecure.add_metric([], 0 if self.node.token else 1)
        yield insecure
        answers = self.node.answers
        held = GaugeMetricFamily(
            "raftlog_answer_bytes_held",
            "Bytes of large answers waiting for their readers' sockets (max_answer_buffer_bytes)",
        )
        held.add_metric([], answers.held)
        refused = CounterMetricFamily(
            "raftlog_answers_refused", "Reads answered 503 busy: max_answer_buffer_bytes was full"
        )
        refused.add_metric([], answers.refused)
        stalled = CounterMetricFamily(
            "raftlog_answers_timed_out",
            "Connections closed because their reader took no answer in answer_send_timeout_s",
        )
        stalled.add_metric([], answers.timed_out)
        yield from (held, refused, stalled)
        archiver = self.node.archiver
        if archiver is None:
            return
        archive_lag = gauge(
            "archive_lag_entries", "Commit index minus the highest index known archived"
        )
        archived = gauge("archive_archived_index", "Highest index known archived contiguously")
        uploaded = counter("archive_uploaded_bytes", "Bytes uploaded to the archive")
        errors = counter("archive_errors", "Archive passes that failed (the store down, ...)")
        reads = counter("archive_reads", "Reads below the compaction floor served from the archive")
        read_entries = counter("archive_read_entries", "Entries read from the archive")
        read_errors = counter(
            "archive_read_errors",
            "Reads below the floor answered 502/503 because the archive could not be read or was "
            "damaged",
        )
        # Imported here: it imports the API's modules, which import this one (through `node`).
        from raftlog.node.server import archive_reads

        served = archive_reads.of(archiver)
        for p, a in archiver.partitions.items():
            lp = [str(p)]
            d = self.node.drivers[p]
            archive_lag.add_metric(lp, max(0, d.raft.commit - a.archived_index))
            archived.add_metric(lp, a.archived_index)
            uploaded.add_metric(lp, a.uploaded_bytes)
            errors.add_metric(lp, a.errors)
            r = served.counters(p)
            reads.add_metric(lp, r.reads)
            read_entries.add_metric(lp, r.entries)
            read_errors.add_metric(lp, r.errors)
        yield from (archive_lag, archived, uploaded, errors, reads, read_entries, read_errors)

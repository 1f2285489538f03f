"""Which peers a node has heard from lately, counted in ticks (node-level, for quiescence).

A quiesced partition runs no election timer (`Raft.quiesced`), so the failure of its leader must
be noticed for all partitions at once, from the node pair's own traffic: a node with a quiesced
partition sends each peer a ping every heartbeat (one per node pair, whatever the partitions),
and any message from a peer counts as hearing from it. A peer not heard from for an election
timeout is silent, and the quiesced partitions that rely on it are woken (`Raft.wake_if_silent`).
"""

from __future__ import annotations


class PeerLiveness:
    def __init__(self, timeout_ticks: int, now: int = 0) -> None:
        self.timeout_ticks = timeout_ticks
        self.started = now  # a peer never heard from is silent only a timeout after the start
        self._heard: dict[str, int] = {}

    def heard(self, peer: str, now: int) -> None:
        self._heard[peer] = now

    def silent(self, peers: set[str] | frozenset[str], now: int) -> set[str]:
        """Those of `peers` not heard from within the timeout."""
        limit = now - self.timeout_ticks
        return {p for p in peers if self._heard.get(p, self.started) < limit}

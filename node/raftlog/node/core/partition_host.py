"""A node hosts every partition of its cluster; each partition is its own Raft group."""

from __future__ import annotations

from collections.abc import Callable

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import InvalidMessage
from raftlog.node.core.raft import Raft, Ready
from raftlog.node.core.storage import LogStorage


class PartitionHost:
    def __init__(
        self,
        node_id: str,
        config: RaftConfig,
        partitions: int,
        storage_for: Callable[[int], LogStorage],
        seed: int = 0,
        raft_cls: type[Raft] = Raft,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions: must be at least 1, got {partitions}")
        self.node_id = node_id
        self.partitions: dict[int, Raft] = {
            p: raft_cls(node_id, config, storage_for(p), seed=seed * 1_000_003 + p)
            for p in range(partitions)
        }

    def raft(self, partition: int) -> Raft:
        try:
            return self.partitions[partition]
        except KeyError:
            raise InvalidMessage(
                "partition",
                f"unknown partition {partition}; this node hosts 0..{len(self.partitions) - 1}",
            ) from None

    def tick(self) -> None:
        for r in self.partitions.values():
            r.tick()

    def step(self, partition: int, message: object) -> None:
        self.raft(partition).step(message)

    def ready(self) -> dict[int, Ready]:
        return {p: r.ready() for p, r in self.partitions.items() if r.has_ready()}

    def advance(self, readies: dict[int, Ready]) -> None:
        for p, rd in readies.items():
            self.partitions[p].advance(rd)

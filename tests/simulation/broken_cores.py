"""Deliberately broken Raft cores: each breaks one safety rule. The simulator must catch them all,
or its checks prove nothing."""

from __future__ import annotations

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.log import RaftLog
from raftlog.node.core.messages import (
    PreVoteRequest,
    PreVoteResponse,
    VoteRequest,
    VoteResponse,
)
from raftlog.node.core.raft import Raft
from raftlog.node.core.storage import LogStorage


class CommitsPreviousTermByCounting(Raft):
    """Commits any entry stored on a majority, even of an older term (Raft paper, figure 8)."""

    def _may_commit_at(self, index: int) -> bool:
        return True


class _NoAnchorTermLog(RaftLog):
    def matches(self, index: int, term: int) -> bool:
        return index <= self.last_index()


class SkipsAnchorCheck(Raft):
    """Accepts an append when it has an entry at prev_index, whatever that entry's term."""

    def __init__(
        self, node_id: str, config: RaftConfig, storage: LogStorage, seed: int = 0
    ) -> None:
        super().__init__(node_id, config, storage, seed)
        # A log of its own rather than its class swapped: the core may run compiled (mypyc),
        # whose objects take interpreted subclasses but not a new class.
        hs, snap = storage.initial_state()
        self.log = _NoAnchorTermLog(storage, hs.commit, snap.index)


class VotesTwice(Raft):
    """Grants every vote request of its term, even after voting for someone else."""

    def _on_vote_request(self, m: VoteRequest) -> None:
        if self.log.is_up_to_date(m.last_index, m.last_term):
            self.vote = m.src
            self._send(VoteResponse(self.id, m.src, self.term, True))
        else:
            super()._on_vote_request(m)


class IgnoresLogInVotes(Raft):
    """Votes (and pre-votes) without checking that the candidate's log is up to date."""

    def _on_pre_vote_request(self, m: PreVoteRequest) -> None:
        grant = m.term > self.term and not self._in_lease()
        self._send(PreVoteResponse(self.id, m.src, m.term if grant else self.term, grant))

    def _on_vote_request(self, m: VoteRequest) -> None:
        grant = self.vote in (None, m.src) and self.leader is None
        if grant:
            self.vote = m.src
            self.election_elapsed = 0
        self._send(VoteResponse(self.id, m.src, self.term, grant))


BROKEN_CORES: dict[str, type[Raft]] = {
    "commits_previous_term_by_counting": CommitsPreviousTermByCounting,
    "skips_anchor_check": SkipsAnchorCheck,
    "votes_twice": VotesTwice,
    "ignores_log_in_votes": IgnoresLogInVotes,
}

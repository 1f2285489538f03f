"""Single-line mutants of the Raft core (`make mutate`).

Each one is a bug a person could plausibly write. `real` marks those planted in the core by an
outside review (issue 16) that once passed the whole of `make test`. `equivalent` names why a
mutant cannot change any observable behaviour (another line already enforces the same rule); a
survivor that is not marked so is a hole in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

RAFT = "node/raftlog/node/core/raft.py"
LOG = "node/raftlog/node/core/log.py"
COMPACTION = "node/raftlog/node/core/compaction.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str  # one whole line, stripped; the first occurrence after `after` is replaced
    new: str
    after: str = ""  # a line (stripped) that comes before `old` in the file, to pick one of several
    real: bool = False
    equivalent: str = ""


MUTANTS: list[Mutant] = [
    Mutant(
        "vote forgotten on a same-term step-down",
        RAFT,
        "self.role = Role.FOLLOWER",
        "self.role, self.vote = Role.FOLLOWER, None",
        after="def _become_follower(self, term: int, leader: str | None, reason: str = "
        '"higher term") -> None:',
        real=True,
    ),
    Mutant(
        "election quorum of half the voters",
        RAFT,
        "need = len(voters) // 2 + 1",
        "need = (len(voters) + 1) // 2",
        real=True,
    ),
    Mutant(
        "ReadIndex answered without a quorum round",
        RAFT,
        "if voters == {self.id}:",
        "if self.id in voters:",
        after="def _start_read(self, request_id: int) -> None:",
        real=True,
    ),
    Mutant(
        "ReadIndex confirmed by half the voters",
        RAFT,
        "quorum = len(self.membership.voters) // 2 + 1",
        "quorum = len(self.membership.voters) // 2",
    ),
    Mutant(
        "compaction floor one past the snapshot",
        COMPACTION,
        "last_removable = min(snapshot_index, applied - config.compact_number_entries)",
        "last_removable = min(snapshot_index + 1, applied - config.compact_number_entries)",
        real=True,
    ),
    Mutant(
        "the boundary entry below the floor matches any term",
        LOG,
        "if index < boundary:",
        "if index <= boundary:",
        after="def matches(self, index: int, term: int) -> bool:",
    ),
    Mutant(
        "heartbeat commit not clamped to the matched index (follower)",
        RAFT,
        "self.log.commit_to(min(m.commit, self._leader_match))",
        "self.log.commit_to(m.commit)",
        real=True,
    ),
    Mutant(
        "a heartbeat matches a log whose last entry is of an older term (follower)",
        RAFT,
        "if self.log.last_term() == m.term:",
        "if self.log.last_term() <= m.term:",
    ),
    Mutant(
        "heartbeat commit not clamped to the matched index (leader)",
        RAFT,
        "commit = min(pr.match, self.log.committed)",
        "commit = self.log.committed",
        after="if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:",
    ),
    Mutant(
        "commit quorum of half the voters",
        RAFT,
        "index = matches[len(matches) // 2]",
        "index = matches[(len(matches) - 1) // 2]",
    ),
    Mutant(
        "learners counted for commit",
        RAFT,
        "voters = self.membership.voters",
        "voters = self.membership.members",
        after="def _maybe_commit(self) -> bool:",
    ),
    Mutant(
        "an older term's entry committed by counting replicas",
        RAFT,
        "return self.log.term(index) == self.term",
        "return True",
    ),
    Mutant(
        "divergent tail kept",
        LOG,
        "if t == e.term:",
        "if t is not None:",
    ),
    Mutant(
        "up-to-date check ignores the last term",
        LOG,
        "return last_term > my_term or (last_term == my_term and last_index >= self.last_index())",
        "return last_term > my_term or last_index >= self.last_index()",
    ),
    Mutant(
        "vote kept across terms",
        RAFT,
        "self.vote = None",
        "pass",
        after="def _become_follower(self, term: int, leader: str | None, reason: str = "
        '"higher term") -> None:',
    ),
    Mutant(
        "a second vote in a term while no leader is known",
        RAFT,
        "can_vote = self.vote == m.src or (self.vote is None and self.leader is None)",
        "can_vote = self.vote in (None, m.src) or self.leader is None",
    ),
    # Survivors of a planted-bug review (2026-11-29), each with a test written for it since.
    Mutant(
        "a second vote in a term whose leader is known",
        RAFT,
        "can_vote = self.vote == m.src or (self.vote is None and self.leader is None)",
        "can_vote = self.vote == m.src or self.vote is None",
    ),
    Mutant(
        "the leader counts its entries not yet written",
        RAFT,
        "(self._self_match() if v == self.id else self.progress[v].match for v in voters),",
        "(self.log.last_index() if v == self.id else self.progress[v].match for v in voters),",
    ),
    Mutant(
        "a new leader takes a change before its no-op commits",
        RAFT,
        "self.pending_conf_index = noop.index",
        "self.pending_conf_index = 0",
    ),
    Mutant(
        "an overwritten membership entry kept (the check)",
        RAFT,
        "if self._config_history[-1][0] < index:",
        "if self._config_history[-1][0] <= index:",
    ),
    Mutant(
        "an overwritten membership entry kept (the loop)",
        RAFT,
        "while len(self._config_history) > 1 and self._config_history[-1][0] >= index:",
        "while len(self._config_history) > 1 and self._config_history[-1][0] > index:",
    ),
    Mutant(
        "a learner's answer confirms a read",
        RAFT,
        "if voter not in self.membership.voters:",
        "if voter not in self.membership.members:",
        after="def _confirm_reads(self, voter: str, ctx: int) -> None:",
    ),
    Mutant(
        "an installed snapshot's members not taken",
        RAFT,
        "self.membership = meta.membership",
        "pass",
    ),
    Mutant(
        "the last voter removed",
        RAFT,
        "if m.voters == {node}:",
        "if False:",
    ),
    Mutant(
        "reads one past the high-water mark",
        RAFT,
        "return self.log.entries(lo, min(hi, self.log.committed + 1))",
        "return self.log.entries(lo, min(hi, self.log.committed + 2))",
    ),
    Mutant(
        "a learner promoted one entry past the lag allowed",
        RAFT,
        "if lag > self.cfg.learner_promotion_lag:",
        "if lag > self.cfg.learner_promotion_lag + 1:",
    ),
    Mutant(
        "a learner campaigns when told to",
        RAFT,
        "if self.role != Role.LEADER and self._promotable():",
        "if self.role != Role.LEADER:",
    ),
    Mutant(
        "leadership handed to a learner",
        RAFT,
        "if target not in self.membership.voters:",
        "if target not in self.membership.members:",
        after="def transfer_leadership(self, target: str) -> None:",
    ),
]


def apply(text: str, m: Mutant) -> str:
    """`text` with the mutant's line replaced; raises if the line is not where it should be."""
    lines = text.split("\n")
    start = 0
    if not m.after and sum(line.strip() == m.old for line in lines) != 1:
        raise ValueError(f"{m.name}: {m.old!r} is not a single line of {m.path}: name `after`")
    if m.after:
        hits = [i for i, line in enumerate(lines) if line.strip() == m.after]
        if len(hits) != 1:
            raise ValueError(f"{m.name}: {len(hits)} lines are {m.after!r} in {m.path}")
        start = hits[0] + 1
    for i in range(start, len(lines)):
        if lines[i].strip() == m.old:
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            lines[i] = indent + m.new
            return "\n".join(lines)
    raise ValueError(f"{m.name}: no line {m.old!r} in {m.path} (the code moved: update the mutant)")

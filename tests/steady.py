"""For multi-node tests whose story needs a leader that moves only when told to.

Under the CI's load (2 cores shared by a Kubernetes cluster and two pytest workers) a node's
event loop can be held past the default election timeout (10 ticks of 50 ms, randomized to at
most 1 s), and an election nobody asked for changes such a story: the leader it found answers
421, a no-op entry takes an index, a transfer's target already leads. 40 ticks (2 to 4 s) keeps
the leader in place through such stalls; tests of failover itself keep the default.
"""

from __future__ import annotations

STEADY_TICKS = 40
STEADY_RAFT = {"election_ticks": STEADY_TICKS}  # LocalCluster(raft=...)
STEADY_ENV = {"RAFTLOG_RAFT__ELECTION_TICKS": str(STEADY_TICKS)}  # LocalCluster(env=...)

"""`raftlog-operator`'s own choices, without an API server."""

from __future__ import annotations

from raftlog.operator.main import default_priority


def test_replicas_never_tie_on_the_default_priority() -> None:
    # kopf pauses every operator of a tied priority, for good; its own default is 0 for all.
    drawn = {default_priority() for _ in range(50)}
    assert len(drawn) > 45 and all(1 <= p < 2**31 for p in drawn)

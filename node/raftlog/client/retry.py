"""What the clients of the node API retry, and how long they wait between tries.

`RETRIED_STATUSES` is the one list of answers worth another try; the JVM reader
(`spark/jvm/.../NodeException.java`) restates it in Java, and `tests/client/test_retry.py`
fails when the two differ.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

# The node answers what may pass with one of these: 421 not the leader (try the one it names),
# 503 not now (no leader yet, an election, behind the asked index, busy, a storage fault on
# this replica: another replica or a later try may serve it), 502 and 504 from a proxy or a
# gateway in front of a node that is restarting. A 500 is left out: the node answers 500 only
# for an unhandled exception, a bug that the same request meets again, so a retry only delays
# the error (every fault the node knows to be passing it answers with 503).
RETRIED_STATUSES: frozenset[int] = frozenset({421, 502, 503, 504})

NO_ANSWER = 0  # the status of a call that got no answer (refused, reset, timed out)
# How long a connection may take to open before the call tries the next endpoint: a live node's
# kernel completes it within milliseconds however busy the node is, so one still not open after
# 3 s is to an address nothing answers (a machine gone, a network dropping its packets).
CONNECT_TIMEOUT_S = 3.0


def retried(status: int) -> bool:
    """Whether a call that ended with `status` (NO_ANSWER included) is worth another try."""
    return status == NO_ANSWER or status in RETRIED_STATUSES


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded tries with exponential back-off and jitter.

    A call is tried again at most `retries` times (None: no count) and, with `within_s`, only
    while less than that has passed since its first try. The pause before retry n (from 0) is
    `min(cap_s, base_s * 2**n)`, scaled by a random factor in [0.5, 1.5) so that clients that
    failed together do not come back together.
    """

    retries: int | None = 8
    within_s: float | None = None
    base_s: float = 0.05
    cap_s: float = 3.2

    def __post_init__(self) -> None:
        if self.retries is None and self.within_s is None:
            raise ValueError("retries: give a number of retries, within_s, or both")

    def delay(self, attempt: int) -> float:
        # 2.0 ** 30 is far past any cap; a bigger power only risks a float overflow.
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 30)) * random.uniform(0.5, 1.5)

    def start(self) -> Tries:
        return Tries(self)


@dataclass
class Tries:
    """The tries of one call under a policy."""

    policy: RetryPolicy
    made: int = 1  # the first try is made when this is asked
    started: float = field(default_factory=time.monotonic)

    def again(self) -> float | None:
        """The pause before one more try, or None when the policy allows no more."""
        p = self.policy
        if p.retries is not None and self.made > p.retries:
            return None
        if p.within_s is not None and time.monotonic() - self.started >= p.within_s:
            return None
        self.made += 1
        return p.delay(self.made - 2)

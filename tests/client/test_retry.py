"""The one retry policy, and the JVM reader retrying exactly the statuses the Python client does
(its `NodeException.retryable`, compiled from the source and asked for every status)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pyspark
import pytest

from raftlog.client.retry import NO_ANSWER, RETRIED_STATUSES, RetryPolicy, retried

JAVA = Path(__file__).parents[2] / "spark/jvm/src/main/java/dev/raftlog/spark"
PROBE = """package dev.raftlog.spark;

public final class RetriedProbe {
  public static void main(String[] args) {
    for (int status = 0; status < 600; status++) {
      if (new NodeException("http://node", status, null).retryable()) {
        System.out.println(status);
      }
    }
  }
}
"""


@pytest.mark.slow  # javac and a JVM: several seconds
def test_the_jvm_reader_retries_exactly_the_statuses_the_python_client_does(tmp_path):
    (tmp_path / "RetriedProbe.java").write_text(PROBE)
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")  # Jackson
    classes = tmp_path / "classes"
    subprocess.run(
        ["javac", "--release", "17", "-d", str(classes), "-cp", jars,
         str(JAVA / "NodeException.java"), str(tmp_path / "RetriedProbe.java")],
        check=True, timeout=300,
    )  # fmt: skip
    out = subprocess.run(
        ["java", "-cp", f"{classes}{os.pathsep}{jars}", "dev.raftlog.spark.RetriedProbe"],
        check=True, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    jvm = {int(line) for line in out.split()}
    assert jvm == {s for s in range(600) if retried(s)} == {NO_ANSWER, *RETRIED_STATUSES}


def test_a_500_is_not_retried_and_a_503_is():
    assert retried(503) and retried(421) and retried(NO_ANSWER)
    assert not retried(500) and not retried(409) and not retried(410)


def test_pauses_grow_to_the_cap_with_jitter():
    p = RetryPolicy(base_s=0.1, cap_s=1.0)
    for attempt, nominal in [(0, 0.1), (1, 0.2), (3, 0.8), (4, 1.0), (10**6, 1.0)]:
        pauses = [p.delay(attempt) for _ in range(200)]
        assert all(0.5 * nominal <= d < 1.5 * nominal for d in pauses), attempt
        assert max(pauses) - min(pauses) > 0.2 * nominal, "jittered"


def test_a_calls_pauses_start_at_the_base_and_double():
    for _ in range(50):
        tries = RetryPolicy(base_s=0.1, cap_s=10.0, retries=3).start()
        first, second, third = tries.again(), tries.again(), tries.again()
        assert first is not None and second is not None and third is not None
        assert 0.05 <= first < 0.15 and 0.1 <= second < 0.3 and 0.2 <= third < 0.6


def test_tries_end_after_the_retries_or_the_time_allowed():
    tries = RetryPolicy(retries=2).start()
    assert tries.again() is not None and tries.again() is not None
    assert tries.again() is None
    timed = RetryPolicy(retries=None, within_s=0.2).start()
    made = 0
    while timed.again() is not None:
        made += 1
        assert made < 10**6
    assert time.monotonic() - timed.started >= 0.2
    assert RetryPolicy(retries=0).start().again() is None
    with pytest.raises(ValueError, match="retries"):
        RetryPolicy(retries=None)

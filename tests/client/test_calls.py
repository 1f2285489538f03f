"""The client's plans without I/O: which node each call asks, what it retries, what it pauses
for, and what it raises, given the answers a test scripts."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from raftlog.client.calls import Calls, ClientError, Pause, Plan, Reply, Request, Send
from raftlog.client.retry import NO_ANSWER, RetryPolicy

A, B, C = "http://a:1", "http://b:1", "http://c:1"
Answer = Callable[[Send], tuple[int, dict[str, Any]] | None]  # None: no answer


def run(plan: Plan[Any], answer: Answer) -> tuple[Any, list[Send | Pause]]:
    """The plan's result and every step it took, each Send answered by `answer`."""
    steps: list[Send | Pause] = []
    reply: Reply | None = None
    while True:
        try:
            step = plan.send(reply)
        except StopIteration as done:
            return done.value, steps
        steps.append(step)
        reply = None
        if isinstance(step, Send):
            got = answer(step)
            if got is None:
                reply = Reply(step.base, NO_ANSWER, reason="ConnectionRefusedError: refused")
            else:
                reply = Reply(step.base, got[0], "application/json", json.dumps(got[1]).encode())


def sends(steps: list[Send | Pause]) -> list[Send]:
    return [s for s in steps if isinstance(s, Send)]


def appended(first: int = 1) -> tuple[int, dict[str, Any]]:
    return 200, {"partition": 0, "first_index": first, "last_index": first, "term": 2}


def calls(*endpoints: str, retries: int = 8, idempotent: bool = True) -> Calls:
    return Calls(list(endpoints), RetryPolicy(retries=retries), idempotent)


def test_an_append_follows_the_leader_hint_at_once_and_remembers_the_leader():
    c = calls(A, B, C)

    def answer(s: Send) -> tuple[int, dict[str, Any]]:
        if s.base != C:
            return 421, {"error": "not_leader", "leader": "n3", "leader_url": C + "/"}
        return appended()

    result, steps = run(c.append(0, [{"value": "v"}]), answer)
    assert result.first_index == 1 and not result.duplicate
    assert [s.base for s in sends(steps)] == [A, C]
    assert not any(isinstance(s, Pause) for s in steps), "a hint is followed without a pause"
    _, steps = run(c.append(0, [{"value": "w"}]), answer)
    assert [s.base for s in sends(steps)] == [C], "the leader is remembered"


def test_a_node_lacking_the_partition_sends_the_call_on_at_once_and_all_lacking_it_fail_it():
    """While a raised partition count rolls out, a member not yet restarted answers 404
    `unknown_partition`: the other endpoints are asked without a pause (the call failed at
    once before). A partition no node has fails once each was asked, without a retry's wait."""
    c = calls(A, B, C)
    lacking = {"error": "unknown_partition", "reason": "partition 2 does not exist (0..1)"}

    def answer(s: Send) -> tuple[int, dict[str, Any]]:
        return (404, lacking) if s.base == A else appended()

    result, steps = run(c.append(2, [{"value": "v"}]), answer)
    assert result.first_index == 1
    assert [s.base for s in sends(steps)] == [A, B]
    assert not any(isinstance(s, Pause) for s in steps)
    with pytest.raises(ClientError) as e:
        run(calls(A, B, C).append(5, [{"value": "v"}]), lambda s: (404, lacking))
    assert (e.value.status, e.value.error) == (404, "unknown_partition")
    assert e.value.url == C
    asked: list[str] = []

    def lacks(s: Send) -> tuple[int, dict[str, Any]]:
        asked.append(s.base)
        return 404, lacking

    with pytest.raises(ClientError) as e:
        run(calls(A, B).read(5, 1, 10), lacks)
    assert e.value.error == "unknown_partition" and asked == [A, B]


def test_a_remembered_leader_that_lacks_the_partition_is_forgotten_and_the_others_asked():
    c = calls(A, B)
    run(c.append(0, [{"value": "v"}]), lambda s: appended())  # A found, remembered
    lacking = {"error": "unknown_partition", "reason": "partition 0 does not exist (0..-1)"}

    def answer(s: Send) -> tuple[int, dict[str, Any]]:
        return (404, lacking) if s.base == A else appended(2)

    result, steps = run(c.append(0, [{"value": "w"}]), answer)
    assert result.first_index == 2 and [s.base for s in sends(steps)] == [A, B]
    _, steps = run(c.append(0, [{"value": "x"}]), answer)
    assert [s.base for s in sends(steps)] == [B], "the node that served it is remembered"


def test_a_leader_found_by_trying_is_remembered_and_forgotten_once_it_fails():
    """A down, B leading: found by trying, then asked first; once B answers nothing, the next
    append goes back to trying the endpoints (a crashed leader is not asked forever)."""
    c = calls(A, B, C)
    down = {A}

    def answer(s: Send) -> tuple[int, dict[str, Any]] | None:
        return None if s.base in down else appended()

    run(c.append(0, [{"value": "v"}]), answer)
    _, steps = run(c.append(0, [{"value": "w"}]), answer)
    assert [s.base for s in sends(steps)] == [B], "the leader found is asked first"
    down.add(B)
    _, steps = run(c.append(0, [{"value": "x"}]), answer)
    assert sends(steps)[0].base == B and sends(steps)[-1].base == C, steps
    _, steps = run(c.append(0, [{"value": "y"}]), answer)
    assert [s.base for s in sends(steps)] == [C], "the new one remembered in turn"


def test_a_crashed_leader_that_followers_still_name_is_not_asked_again_within_the_call():
    """A leads and crashes; B and C name it for their election timeout (here 4 answers), then
    C leads. The hint to a node silent in this call is not followed, and the silent node is
    asked again only once every other was: within raftctl's retries the call reaches C (it
    spent every other try on A and gave up before)."""
    c = calls(A, B, C, retries=6)
    run(c.append(0, [{"value": "v"}]), lambda s: appended())  # A found, remembered
    named = iter(range(4))

    def answer(s: Send) -> tuple[int, dict[str, Any]] | None:
        if s.base == A:
            return None
        if next(named, None) is not None:
            return 421, {"error": "not_leader", "leader": "a", "leader_url": A + "/"}
        if s.base == C:
            return appended(2)
        return 421, {"error": "not_leader", "leader": "c", "leader_url": C}

    result, steps = run(c.append(0, [{"value": "w"}]), answer)
    assert result.first_index == 2
    bases = [s.base for s in sends(steps)]
    assert bases[0] == A and bases[-1] == C, bases
    # Asked again only once the others were, each time (it was every other try).
    assert all(A not in bases[i + 1 : i + 3] for i, b in enumerate(bases) if b == A), bases
    # A live leader that missed one answer is asked again after a round, hints and all (a
    # first version never asked it again in the call, and the call failed).
    c = calls(A, B, C, retries=7)
    run(c.append(0, [{"value": "v"}]), lambda s: appended())
    missed = [True]

    def once_silent(s: Send) -> tuple[int, dict[str, Any]] | None:
        if s.base == A:
            if missed.pop() if missed else False:
                return None
            return appended(3)
        return 421, {"error": "not_leader", "leader": "a", "leader_url": A}

    result, steps = run(c.append(0, [{"value": "x"}]), once_silent)
    assert result.first_index == 3 and [s.base for s in sends(steps)][-1] == A
    # Silent nodes are asked again once none other is left to ask.
    asked: list[str] = []

    def none_answer(s: Send) -> None:
        asked.append(s.base)

    with pytest.raises(ClientError) as e:
        run(calls(A, B, retries=3).append(0, [{"value": "x"}]), none_answer)
    assert e.value.status == NO_ANSWER and asked == [A, B, A, B]


@pytest.mark.parametrize("status", [421, 502, 503, 504, NO_ANSWER])
def test_passing_failures_are_retried_after_a_pause_on_the_next_endpoint(status):
    failures = iter([True, True])

    def answer(s: Send) -> tuple[int, dict[str, Any]] | None:
        if next(failures, False):
            return None if status == NO_ANSWER else (status, {"error": "x", "reason": "x"})
        return appended()

    result, steps = run(calls(A, B, C).append(0, [{"value": "v"}]), answer)
    assert result.first_index == 1
    assert [type(s) for s in steps] == [Send, Pause, Send, Pause, Send]
    assert [s.base for s in sends(steps)] == [A, B, C]


@pytest.mark.parametrize("status", [400, 401, 404, 409, 410, 500])
def test_other_answers_are_raised_at_once(status):
    with pytest.raises(ClientError) as e:
        run(calls(A, B).append(0, [{"value": "v"}]), lambda s: (status, {"error": "no"}))
    assert e.value.status == status and e.value.url == A and not e.value.retryable


def test_the_retries_are_bounded_and_the_last_failure_is_raised():
    plan = calls(A, B, retries=3).read(0, 1, 10)
    steps: list[Send | Pause] = []

    def answer(s: Send) -> None:
        steps.append(s)
        return None

    with pytest.raises(ClientError) as e:
        run(plan, answer)
    assert e.value.status == NO_ANSWER and e.value.retryable
    assert "no answer: ConnectionRefusedError" in str(e.value)
    assert len(steps) == 4, "one try and three retries"


def test_idempotent_appends_take_lanes_and_a_failed_lane_is_dropped():
    c = calls(A, retries=0)
    bodies: list[dict[str, Any]] = []

    def ok(s: Send) -> tuple[int, dict[str, Any]]:
        bodies.append(s.request.body)
        return appended()

    run(c.append(0, [{"value": "1"}, {"value": "2"}]), ok)
    run(c.append(0, [{"value": "3"}]), ok)
    first, second = bodies
    assert first["producer_id"] == second["producer_id"]
    assert (first["sequence"], second["sequence"]) == (0, 2)
    with pytest.raises(ClientError):
        run(c.append(0, [{"value": "4"}]), lambda s: (503, {"error": "timeout"}))
    run(c.append(0, [{"value": "5"}]), ok)
    assert bodies[-1]["producer_id"] != first["producer_id"], "whether 4 landed is unknown"
    assert bodies[-1]["sequence"] == 0
    run(calls(A, idempotent=False).append(0, [{"value": "6"}]), ok)
    assert "producer_id" not in bodies[-1]


def test_a_batch_partly_appended_is_retried_only_under_a_producer_id():
    """503 `partly_appended`: the first records of the batch went in. Under a producer id the
    retry appends only the rest; without one it would append them twice, so it is raised at
    once (found by a review)."""
    cut = (503, {"error": "partly_appended", "reason": "the first 2 records ..."})
    answers = iter([cut, appended()])
    result, steps = run(calls(A).append(0, [{"value": "1"}]), lambda s: next(answers))
    assert result.first_index == 1 and len(sends(steps)) == 2
    sent: list[Send] = []

    def once(s: Send) -> tuple[int, dict[str, Any]]:
        sent.append(s)
        return cut if len(sent) == 1 else appended()

    with pytest.raises(ClientError, match="partly_appended"):
        run(calls(A, idempotent=False).append(0, [{"value": "1"}]), once)
    assert len(sent) == 1, "not sent again without a producer id"


def test_a_leader_found_by_an_admin_call_is_not_where_appends_go():
    """With the ports split, a hint on the admin API names the leader's peer port, where the
    client routes are a 404: the leader an archive flush found is kept apart from the one
    appends go to (found by a review: one cache for both)."""
    peer_b = "http://b:2"
    c = calls(A, B)

    def answer(s: Send) -> tuple[int, dict[str, Any]]:
        if s.request.path.endswith("/archive"):
            if s.base == peer_b:
                return 200, {"archived_index": 5}
            return 421, {"error": "not_leader", "leader": "b", "leader_url": peer_b}
        if s.base == B:
            return appended()
        return 421, {"error": "not_leader", "leader": "b", "leader_url": B}

    assert run(c.archive_flush(0), answer)[0] == {"archived_index": 5}
    _, steps = run(c.append(0, [{"value": "v"}]), answer)
    assert peer_b not in [s.base for s in sends(steps)]
    _, steps = run(c.archive_flush(0), answer)
    assert [s.base for s in sends(steps)] == [peer_b], "its own leader remembered"


def test_an_admin_call_goes_to_the_leader_the_statuses_name_and_is_tried_once():
    asked: list[tuple[str, str]] = []

    def answer(s: Send) -> tuple[int, dict[str, Any]] | None:
        asked.append((s.base, s.request.path))
        if s.request.path == "/v1/status":
            if s.base == A:
                return None  # down: passed over
            role = "leader" if s.base == C else "follower"
            return 200, {"partitions": [{"partition": 1, "role": role}]}
        return 503, {"error": "timeout", "reason": "not committed yet"}

    with pytest.raises(ClientError) as e:
        run(calls(A, B, C).transfer_leader(1, "n2"), answer)
    assert e.value.status == 503 and e.value.url == C
    transfer = "/v1/admin/partitions/1/transfer"
    assert asked == [(A, "/v1/status"), (B, "/v1/status"), (C, "/v1/status"), (C, transfer)]
    got: list[Request] = []

    def record(s: Send) -> tuple[int, dict[str, Any]]:
        got.append(s.request)
        return 200, {"partition": 1, "leader": "n2"}

    reply, steps = run(calls(A, B, C).transfer_leader(1, "n2", endpoint=B + "/"), record)
    assert reply == {"partition": 1, "leader": "n2"}
    assert [s.base for s in sends(steps)] == [B], "a given endpoint is asked, nothing else"
    assert got == [Request("POST", transfer, {"target": "n2"})]


def test_an_archive_flush_is_asked_again_at_the_leader_until_it_is_done():
    """A backup point: the leader answers "ask again" when its leadership moved during the
    flush; raftctl's flush follows the hint and asks again. The operator's, at an endpoint it
    names, is tried once (its next pass asks again)."""
    flush = "/v1/admin/partitions/0/archive"
    at_b: list[tuple[int, dict[str, Any]]] = [
        (503, {"error": "archive_failed", "reason": "archived up to 0, below the read point 64"}),
        (200, {"partition": 0, "archived_index": 70, "commit": 64}),
    ]

    def answer(s: Send) -> tuple[int, dict[str, Any]]:
        assert s.request.path == flush
        if s.base == A:
            return 421, {"error": "not_leader", "leader": "n2", "leader_url": B}
        return at_b.pop(0)

    reply, steps = run(calls(A, B).archive_flush(0), answer)
    assert reply["archived_index"] == 70 and not at_b
    assert [s.base for s in sends(steps)] == [A, B, A, B]
    failing = {"error": "archive_failed", "reason": "ask again"}
    with pytest.raises(ClientError) as e:
        run(calls(A, B).archive_flush(0, endpoint=B), lambda s: (503, failing))
    assert e.value.status == 503


def test_no_leader_found_is_a_503_no_leader():
    follower = {"partitions": [{"partition": 0, "role": "follower"}]}
    with pytest.raises(ClientError) as e:
        run(calls(A, B).follower_lag(0, "n2"), lambda s: (200, follower))
    assert (e.value.status, e.value.error) == (503, "no_leader")


def test_no_leader_found_with_one_endpoint_down_is_still_a_503_no_leader():
    """Found by a planted bug: with one endpoint down and the others answering without a
    leader, the down one's error was as good as `no_leader` to every test."""
    follower = {"partitions": [{"partition": 0, "role": "follower"}]}
    with pytest.raises(ClientError) as e:
        run(calls(A, B).follower_lag(0, "n2"), lambda s: None if s.base == A else (200, follower))
    assert (e.value.status, e.value.error) == (503, "no_leader")
    with pytest.raises(ClientError) as e:
        run(calls(A, B).follower_lag(3, "n2"), lambda s: None if s.base == A else (200, follower))
    assert (e.value.status, e.value.error) == (404, "unknown_partition")
    with pytest.raises(ClientError) as e:  # none answered: the last one's own error
        run(calls(A, B).follower_lag(0, "n2"), lambda s: None)
    assert e.value.status == NO_ANSWER


def test_a_long_polls_wait_is_given_in_seconds():
    """Found by a planted bug: a `wait_ms` taken for seconds held a stalled node's answer for
    hours before the next replica was asked."""
    _, steps = run(calls(A).read(0, 1, 10, wait_ms=2500), lambda s: (200, {"records": []}))
    assert [s.request.wait_s for s in sends(steps)] == [2.5]


def test_names_in_paths_are_percent_encoded():
    got: list[str] = []

    def record(s: Send) -> tuple[int, dict[str, Any]]:
        got.append(s.request.path)
        return 200, {}

    run(calls().set_hold(A, 2, "job/one two", 10, 60.0), record)
    run(calls().follower_lag(2, "n?1", endpoint=A), record)
    assert got == [
        "/v1/admin/partitions/2/holds/job%2Fone%20two",
        "/v1/admin/partitions/2/followers/n%3F1/lag",
    ]


def test_a_refusal_names_the_field_the_node_named():
    """Found by a review: "HTTP 400 bad_request: give both or neither" left out which field."""
    refused = ClientError(400, {"error": "bad_request", "reason": "must be 1..10000, got 0",
                                "field": "limit"}, A)  # fmt: skip
    assert str(refused) == f"{A}: HTTP 400 bad_request (field limit): must be 1..10000, got 0"
    assert str(ClientError(503, {"error": "busy", "reason": "retry"})) == "HTTP 503 busy: retry"


def test_a_2xx_answer_that_is_not_json_is_a_bad_response():
    plan = calls(A).status(A)
    step = next(plan)
    assert isinstance(step, Send)
    with pytest.raises(ClientError) as e:
        plan.send(Reply(A, 200, "text/html", b"<html>"))
    assert (e.value.status, e.value.error) == (200, "bad_response")


def test_an_error_answer_that_is_not_json_keeps_its_start_as_the_reason():
    error = Reply(A, 502, "text/html", b"<html>Bad Gateway</html>").error()
    assert error.retryable and error.reason == "<html>Bad Gateway</html>"


def test_calls_that_choose_a_node_need_endpoints():
    with pytest.raises(ValueError, match="endpoints"):
        run(calls().read(0), lambda s: (200, {}))


def test_a_client_error_survives_pickling_as_spark_sends_it_back_from_a_task():
    e = Reply(A, 503, "application/json", b'{"error": "behind", "reason": "at 4"}').error()
    back = pickle.loads(pickle.dumps(e))
    assert (back.status, back.body, back.url, str(back)) == (e.status, e.body, e.url, str(e))

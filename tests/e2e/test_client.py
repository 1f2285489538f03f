"""The Python client against a real node whose answers get lost on the way back."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from raftlog.client import AsyncClient, Client, IdempotentProducer
from raftlog.client.calls import ClientError
from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e]
TOKEN = "client-test-token"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("client")
    (d / "token").write_text(TOKEN)
    with LocalCluster(d, replicas=1, partitions=2, auth_token_file=d / "token", durable=False) as c:
        c.wait_ready()
        yield c


class AnswerEater:
    """A TCP proxy to the node that forwards every request but eats the first `eat` answers
    that are 200s: once the node has answered one, it closes the client's side, as a connection
    reset after the server committed would. Until then each connection carries one answer."""

    def __init__(self, target: str, eat: int = 1) -> None:
        u = urlsplit(target)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.eat = eat
        self.eaten = 0
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def __aenter__(self) -> AnswerEater:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(self.host, self.port)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()

        forward = asyncio.create_task(pump(client_r, up_w))
        try:
            status = await up_r.readline()
            if self.eaten >= self.eat:
                client_w.write(status)
                await pump(up_r, client_w)
            elif status.split(b" ")[1:2] == [b"200"]:
                self.eaten += 1  # the append is in the log; its answer goes nowhere
            else:
                # Another answer (a 503 while a new leader applies its no-op) goes through
                # whole, and the connection closes, so the client's retry comes on a new one.
                head = status + await up_r.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                assert length is not None, head
                client_w.write(head + await up_r.readexactly(int(length.group(1))))
                await client_w.drain()
        finally:
            forward.cancel()
            for w in (client_w, up_w):
                w.close()


def values(c: LocalCluster, partition: int) -> list[str]:
    code, page = c.get("n1", f"/v1/partitions/{partition}/records?from=1&limit=1000")
    assert code == 200, page
    return [r["value"] for r in page["records"]]


@pytest.mark.parametrize("idempotent", [True, False], ids=["default", "idempotence-off"])
def test_a_retry_after_a_lost_answer_lands_once_by_default(node, idempotent):
    """The append commits, its answer is lost, the client retries: by default the node knows
    the retry (producer id and sequence) and answers it with the first attempt's indexes.
    Without idempotence the same retry adds the record a second time: the fault is real."""
    value = f"lost-answer-{idempotent}"

    async def run() -> None:
        async with (
            AnswerEater(node.nodes["n1"].url) as proxy,
            AsyncClient([proxy.url], token=TOKEN, idempotent=idempotent) as c,
        ):
            result = await c.append(1, [{"key": "k", "value": value}])
            assert proxy.eaten == 1
            assert result.duplicate is idempotent
            after = await c.append(1, [{"key": "k", "value": value + "-next"}])
            assert after.first_index > result.last_index and not after.duplicate

    asyncio.run(run())
    assert values(node, 1).count(value) == (1 if idempotent else 2)
    assert values(node, 1).count(value + "-next") == 1


def test_concurrent_appends_to_one_partition_all_land_once(node):
    """Plain appends from one client to one partition run side by side (each under a producer
    id of its own), none refused for its sequence."""

    async def run() -> list[int]:
        async with AsyncClient([node.nodes["n1"].url], token=TOKEN) as c:
            done = await asyncio.gather(
                *(c.append(0, [{"key": f"c{i}", "value": f"c{i}"}]) for i in range(30))
            )
            again = await asyncio.gather(
                *(c.append(0, [{"key": f"d{i}", "value": f"d{i}"}]) for i in range(30))
            )
            return [r.first_index for r in done + again]

    indexes = asyncio.run(run())
    assert len(set(indexes)) == 60
    got = values(node, 0)
    for i in range(30):
        assert got.count(f"c{i}") == 1 and got.count(f"d{i}") == 1


def test_a_producer_restarted_under_its_id_resumes_from_the_sequences_it_kept(node):
    """Found by a review: a writer restarted under the same producer id started at sequence
    0 again, and its new records were taken for ones in the log (409) and not appended. It
    gives the sequences it kept (`next_sequence`), and its new records land; without them it is
    told, not silently skipped."""

    async def run() -> None:
        async with AsyncClient([node.nodes["n1"].url], token=TOKEN) as c:
            first = IdempotentProducer(c, "restarted")
            for i in range(3):
                await first.append(1, [{"value": f"restarted-{i}"}])
            kept = {1: first.next_sequence(1)}
            assert kept == {1: 3}
            naive = IdempotentProducer(c, "restarted")  # its state lost
            with pytest.raises(ClientError, match="sequence_conflict"):
                await naive.append(1, [{"value": "restarted-new"}])
            resumed = IdempotentProducer(c, "restarted", next_sequences=kept)
            done = await resumed.append(1, [{"value": "restarted-new"}])
            assert not done.duplicate and resumed.next_sequence(1) == 4
            page = await c.read(1, 1, limit=1000)
            values = [r.get("value") for r in page["records"]]
            assert [v for v in values if str(v).startswith("restarted")] == [
                "restarted-0", "restarted-1", "restarted-2", "restarted-new"
            ]  # fmt: skip

    asyncio.run(run())


def test_a_long_poll_longer_than_the_clients_timeout_is_answered(node):
    """Found by a review: `read(wait_ms=...)` kept the client's timeout, so a poll of a quiet
    partition longer than it always ended as "no answer". Both clients give it the wait too."""
    url = node.nodes["n1"].url

    async def run() -> dict[str, Any]:
        async with AsyncClient([url], token=TOKEN, timeout_s=1.0, retries=0) as c:
            return await c.read(0, 10**6, wait_ms=1500)

    assert asyncio.run(run())["records"] == []
    with Client([url], token=TOKEN, timeout_s=1.0, retries=0) as c:
        assert c.read(0, 10**6, wait_ms=1500)["records"] == []


def test_a_blocking_client_shared_by_threads_answers_each_its_own_call(node):
    """Found by a review: six threads on one `Client` got one another's answers, a sequence
    conflict, and sockets closed under them (`Bad file descriptor`). Its calls go one at a
    time: no two requests are ever on its connections at once (each held 5 ms here)."""
    url = node.nodes["n1"].url
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    inside, most = [0], [0]
    with Client([url], token=TOKEN) as c:
        send = c._send

        def held(step: Any) -> Any:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.005)
            try:
                return send(step)
            finally:
                inside[0] -= 1

        c._send = held  # type: ignore[method-assign]

        def worker(t: int) -> None:
            try:
                got[t] = [c.append(1, [{"value": f"shared-{t}-{i}"}]).last_index for i in range(10)]
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        assert most[0] == 1, f"{most[0]} requests at once on one client"
        indexes = [i for t in range(6) for i in got[t]]
        assert len(set(indexes)) == 60, "every call got its own answer"
        values = {
            r["index"]: r.get("value") for r in c.read(1, min(indexes), limit=1000)["records"]
        }
    assert all(values[i] == f"shared-{t}-{k}" for t in range(6) for k, i in enumerate(got[t]))

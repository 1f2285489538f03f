"""One PySyncObj node behind a minimal aiohttp front end (the comparison target of `bench.compare`).

What a Python user would build instead of raftlog: PySyncObj's replicated list (`ReplList`, one of
its batteries) on a 3-node cluster, and an aiohttp handler that appends the posted value and
answers once PySyncObj has applied it on this node (its callback, from PySyncObj's own thread).
PySyncObj is not a dependency of raftlog: `bench.compare` installs it (0.3.17) for the run.

    python -m bench.pysyncobj_front SELF_ADDR PARTNER_ADDR,... HTTP_PORT JOURNAL_FILE BATCH(0|1)
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from typing import Any

from aiohttp import web

LEADER = 2  # PySyncObj's _RAFT_STATE.LEADER


def main() -> None:
    self_addr, partners, port, journal, batch = sys.argv[1:6]
    psync = importlib.import_module("pysyncobj")
    batteries = importlib.import_module("pysyncobj.batteries")
    records = batteries.ReplList()
    conf = psync.SyncObjConf(
        appendEntriesUseBatch=batch == "1", journalFile=journal, dynamicMembershipChange=False
    )
    obj = psync.SyncObj(self_addr, partners.split(","), conf=conf, consumers=[records])

    async def append(request: web.Request) -> web.Response:
        body = await request.json()
        value = body["value"]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def resolve(result: Any, error: Any) -> None:
            if not fut.done():
                if error == psync.FAIL_REASON.SUCCESS:
                    fut.set_result(result)
                else:
                    fut.set_exception(RuntimeError(f"PySyncObj failed: {error}"))

        def callback(result: Any, error: Any) -> None:  # PySyncObj's thread
            loop.call_soon_threadsafe(resolve, result, error)

        records.append(value, callback=callback)
        try:
            await asyncio.wait_for(fut, 10)
        except (RuntimeError, TimeoutError) as e:
            return web.json_response({"error": "unavailable", "reason": str(e)}, status=503)
        index = obj.raftLastApplied
        return web.json_response(
            {"partition": 0, "first_index": index, "last_index": index, "term": obj.raftCurrentTerm}
        )

    async def status(request: web.Request) -> web.Response:
        st = obj.getStatus()
        return web.Response(
            text=json.dumps({"leader": st["state"] == LEADER, "has_quorum": st["has_quorum"]}),
            content_type="application/json",
        )

    app = web.Application()
    app.router.add_post("/v1/partitions/0/records", append)
    app.router.add_get("/status", status)
    web.run_app(app, host="127.0.0.1", port=int(port), print=None, access_log=None)


if __name__ == "__main__":
    main()

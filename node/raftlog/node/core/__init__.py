"""Sans-I/O Raft core: one deterministic state machine per partition.

Nothing in this package touches sockets, files, clocks or asyncio. Drivers feed it messages and
ticks, and carry out what its `Ready` asks for (persist, send, apply, snapshot) before `advance`.

Its names are imported from their modules (`core.raft`, `core.types`, `core.messages`, ...),
not re-exported here: a reader that needs only `core.types` (Spark's workers, through the
archive's objects) then does not load the core and its settings' pydantic (about 75 ms a
process).
"""

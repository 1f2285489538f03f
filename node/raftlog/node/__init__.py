"""The raftlog node: Raft core, storage, simulator and (later) the server process."""

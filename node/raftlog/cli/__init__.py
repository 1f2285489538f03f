"""`raftctl`: the command line of raftlog."""

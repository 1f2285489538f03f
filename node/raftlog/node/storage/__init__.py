"""Storage of a partition: log entries, hard state and snapshots."""

"""Jobs bundled with the `raftlog` Spark source (`python -m raftlog.spark.jobs.<name>`)."""

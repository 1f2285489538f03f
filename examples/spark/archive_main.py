"""The archive job's entry file for spark-submit, which runs a Python file rather than `-m`.

Baked into the image at /opt/raftlog/archive_main.py (see Dockerfile).
"""

from raftlog.spark.jobs.archive import main

raise SystemExit(main())

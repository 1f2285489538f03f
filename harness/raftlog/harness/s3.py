"""A real S3-compatible server on 127.0.0.1, for tests and the local mode: SeaweedFS's `weed`.

`S3Server` is the shipped `raftlog.operator.local_s3.WeedS3` (which `raftctl local up
--object-store` runs too: `weed mini` on free ports, one static identity, a folder of its own),
with the binary the tests want: `$RAFTLOG_WEED`, else the one `cluster.build` builds from the Go
module proxy on first use (`make s3server` builds it ahead), cached under
~/.cache/raftlog-cluster/seaweedfs-<version>/.

    with S3Server(buckets=("archive",)) as s3:
        store = obstore.store.S3Store("archive", **s3.obstore_config())
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from raftlog.operator.local_s3 import WEED_ENV, WeedS3, find_weed
from raftlog.operator.local_s3 import LocalS3Error as S3ServerError

__all__ = ["WEED_ENV", "S3Server", "S3ServerError", "weed_binary"]


def weed_binary() -> Path:
    """`weed`: `$RAFTLOG_WEED`, else the one `cluster.build` built (building it the first time)."""
    env = os.environ.get(WEED_ENV)
    if env:
        return Path(env)
    try:
        from cluster import build
    except ImportError:  # not run from the checkout (the repository root not on sys.path)
        return find_weed()
    return build.ensure_weed()


@dataclass
class S3Server(WeedS3):
    """One SeaweedFS S3 endpoint; a context manager (start on enter, stop on exit).

    `data_dir` keeps the objects across a stop and start (or a new `S3Server` on the same folder);
    without one, a temporary folder is made and removed on `stop`. The process's output goes to
    `log_path` (appended to across restarts).
    """

    def weed_binary(self) -> Path:
        return Path(self.weed) if self.weed is not None else weed_binary()

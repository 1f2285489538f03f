"""`python -m cluster up|down|build`: the test cluster's one entry point (`make cluster`).

`python -m cluster weed` builds the S3-compatible server of the tests (SeaweedFS) and prints its
path (`make s3server`); the cluster itself does not use it.
"""

from __future__ import annotations

import argparse

from cluster import build, images, up


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cluster", description=__doc__)
    ap.add_argument("command", choices=["up", "down", "status", "build", "weed"])
    args = ap.parse_args(argv)
    if args.command == "up":
        up.up()
    elif args.command == "down":
        up.down()
    elif args.command == "status":
        return up.status()
    elif args.command == "weed":
        print(build.ensure_weed())
    else:
        build.ensure_packages()
        images.ensure_all(build.ensure_binaries())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

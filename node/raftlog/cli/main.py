"""`raftctl`: administer raftlog nodes and their data."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    # Imported here, inside main's Ctrl-C handling: they take a few tenths of a second, and a
    # Ctrl-C meanwhile printed a traceback.
    from raftlog.cli import archive_cmds, cluster_cmds, wal_check

    ap = argparse.ArgumentParser(prog="raftctl", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wal = sub.add_parser("wal", help="inspect and repair write-ahead logs on disk")
    wal_sub = wal.add_subparsers(dest="wal_command", required=True, metavar="WAL_COMMAND")
    wal_check.add_parser(wal_sub)
    cluster_cmds.add_parsers(sub)
    archive_cmds.add_parsers(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.run(args))
    except KeyboardInterrupt:  # Ctrl-C (`tail -f`, or while starting): no traceback
        return 130


if __name__ == "__main__":
    sys.exit(main())

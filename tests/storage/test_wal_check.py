"""`raftctl wal check`: read-only report, refused repair without confirmation, repair on request."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.storage.helpers import ents, records_end

from raftlog.cli.main import main
from raftlog.node.core.types import HardState, Membership
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import CorruptFile, WalCorruption
from raftlog.node.storage.recovery import list_segments


def make_node(root: Path) -> Path:
    s = DurableStorage(
        str(root / "p0"), bootstrap=Membership.of(["a", "b", "c"]), segment_bytes=2048
    )
    s.save(HardState(2, "a", 40), ents(1, 100, 2))
    s.close()
    return root / "p0" / "wal"


def flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x04
    path.write_bytes(bytes(raw))


def snapshot_of(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_healthy_wal_report(tmp_path, capsys):
    make_node(tmp_path)
    assert main(["wal", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "entries     1..100 (100 entries, 0 membership)" in out
    assert "hard state  term 2, vote a" in out
    assert "snapshot    index 0, term 0, voters=['a', 'b', 'c']" in out
    assert "status      OK" in out


def test_torn_tail_is_reported_as_what_the_node_will_do_and_left_alone(tmp_path, capsys):
    wal = make_node(tmp_path)
    last = wal / list_segments(str(wal))[-1][1]
    raw = last.read_bytes()
    end = records_end(str(last))
    torn = raw[: end - 12] + bytes(len(raw) - end + 12)  # the last record cut short by zeros
    last.write_bytes(torn)
    assert main(["wal", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "will truncate a torn tail" in out and "status      OK" in out
    assert last.read_bytes() == torn, "check is read-only"


def test_corruption_is_reported_and_repaired_only_when_asked(tmp_path, capsys):
    wal = make_node(tmp_path)
    second = wal / list_segments(str(wal))[1][1]
    flip(second, 200)
    before = snapshot_of(wal)
    assert main(["wal", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPTED: record checksum mismatch" in out and str(second) in out
    assert "(log index" in out
    # --repair without a terminal and without --yes prints the plan and changes nothing.
    assert main(["wal", "check", "--repair", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "repair plan:" in out and f"truncate {second}" in out and "not repaired" in out
    assert snapshot_of(wal) == before
    assert main(["wal", "check", "--repair", "--yes", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.index("repair plan:") < out.index("repaired: the WAL opens cleanly")
    assert main(["wal", "check", str(tmp_path)]) == 0
    s = DurableStorage(str(tmp_path / "p0"))
    assert s.entries(1, s.last_index() + 1) == ents(1, s.last_index(), 2)


def test_console_script_exit_codes(tmp_path):
    raftctl = [sys.executable, "-m", "raftlog.cli.main"]
    r = subprocess.run([*raftctl, "wal", "check", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "no WAL segments" in r.stderr
    r = subprocess.run(
        [*raftctl, "wal", "check", str(tmp_path / "x")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "no such directory" in r.stderr
    make_node(tmp_path)
    r = subprocess.run([*raftctl, "wal", "check", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and "status      OK" in r.stdout


def _the_node_refuses(root: Path) -> str:
    """What opening the partition as the node does says (it must refuse)."""
    try:
        DurableStorage(str(root / "p0")).close()
    except (WalCorruption, CorruptFile, OSError) as e:
        return str(e)
    raise AssertionError("the node opened it")


def test_what_the_node_refuses_to_start_on_check_reports_corrupted(tmp_path, capsys):
    """Found by a disk-fault review: `wal check` said OK (exit 0) where the node refused to
    start, and a file replaced by a directory was a traceback. Each case here is checked against
    the node's own open first."""

    def first_segment_gone(p: Path) -> None:
        (p / "wal" / list_segments(str(p / "wal"))[0][1]).unlink()

    def hard_state_a_directory(p: Path) -> None:
        (p / "hardstate").unlink()
        (p / "hardstate").mkdir()

    cases: dict[str, Callable[[Path], None]] = {
        "hard state flipped": lambda p: flip(p / "hardstate", 10),
        "first segment gone": first_segment_gone,
        "hard state a directory": hard_state_a_directory,
    }
    for i, (name, damage) in enumerate(cases.items()):
        root = tmp_path / str(i)
        make_node(root)
        damage(root / "p0")
        refused = _the_node_refuses(root)
        assert main(["wal", "check", str(root)]) == 1, (name, refused)
        out = capsys.readouterr().out
        assert "status      CORRUPTED" in out and "Traceback" not in out, (name, out)
    seg = tmp_path / "seg"
    wal = make_node(seg)
    last = wal / list_segments(str(wal))[-1][1]
    last.unlink()
    last.mkdir()
    assert main(["wal", "check", str(seg)]) == 1
    assert "CORRUPTED: unreadable" in capsys.readouterr().out

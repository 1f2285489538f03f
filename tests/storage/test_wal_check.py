"""`raftctl wal check`: read-only report, refused repair without confirmation, repair on request."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.storage.helpers import ents, records_end

from raftlog.cli.main import main
from raftlog.node.core.types import HardState, Membership
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import CorruptFile, WalCorruption
from raftlog.node.storage.journal import Journal, list_journal
from raftlog.node.storage.recovery import analyze_wal, list_segments

ABC = Membership.of(["a", "b", "c"])


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


def test_console_script_exit_codes(tmp_path, capsys):
    raftctl = [sys.executable, "-m", "raftlog.cli.main"]
    r = subprocess.run([*raftctl, "wal", "check", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "no WAL segments" in r.stderr
    r = subprocess.run(
        [*raftctl, "wal", "check", str(tmp_path / "x")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "no such directory" in r.stderr
    assert main(["wal", "check", __file__]) == 2  # a file: it exists, and is no directory
    assert f"{__file__}: not a directory" in capsys.readouterr().err
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

    def wal_a_file(p: Path) -> None:  # found by a fault helper: `wal check` said OK
        shutil.rmtree(p / "wal")
        (p / "wal").write_bytes(b"not a WAL")

    cases: dict[str, Callable[[Path], None]] = {
        "hard state flipped": lambda p: flip(p / "hardstate", 10),
        "first segment gone": first_segment_gone,
        "hard state a directory": hard_state_a_directory,
        "hard state deleted": lambda p: (p / "hardstate").unlink(),
        "WAL a file": wal_a_file,
    }
    for i, (name, damage) in enumerate(cases.items()):
        root = tmp_path / str(i)
        make_node(root)
        damage(root / "p0")
        refused = _the_node_refuses(root)
        assert main(["wal", "check", str(root)]) == 1, (name, refused)
        out = capsys.readouterr().out
        assert "status      CORRUPTED" in out and "Traceback" not in out, (name, out)
        if name == "hard state deleted":
            assert "hard state  none" in out
            assert "the hard state is missing while the WAL holds entries up to 100" in out
            assert "term and vote are lost" in refused and refused.startswith(
                str(root / "p0" / "hardstate") + " is missing"
            )
        if name == "WAL a file":
            assert "is a file where a WAL's directory belongs" in refused, refused
            assert "CORRUPTED: a file where a WAL's directory belongs" in out, out
    # The node's journal a file: the node said `[Errno 17] File exists`, `wal check` OK.
    node = tmp_path / "journal-a-file"
    make_node(node)
    (node / "journal").write_bytes(b"not a journal")
    with pytest.raises(CorruptFile, match="is a file where the journal's directory belongs"):
        Journal(str(node / "journal"))
    assert main(["wal", "check", str(node)]) == 1
    assert "CORRUPTED: a file where the journal's directory belongs" in capsys.readouterr().out
    seg = tmp_path / "seg"
    wal = make_node(seg)
    last = wal / list_segments(str(wal))[-1][1]
    last.unlink()
    last.mkdir()
    assert main(["wal", "check", str(seg)]) == 1
    assert "CORRUPTED: unreadable" in capsys.readouterr().out


class Terminal(io.StringIO):
    """A standard input that is a terminal (pytest's is none)."""

    def isatty(self) -> bool:
        return True


def test_the_repair_plan_names_every_byte_it_drops_and_asks_for_the_word_repair(
    tmp_path, capsys, monkeypatch
):
    wal = make_node(tmp_path)
    names = [name for _, name in list_segments(str(wal))]
    second = wal / names[1]
    flip(second, 200)
    damage = analyze_wal(str(wal)).corruption
    assert damage is not None and damage.path == str(second) and damage.index is not None
    sizes = {name: (wal / name).stat().st_size for name in names}
    before = snapshot_of(wal)
    # A terminal to confirm on, and what is typed there.
    monkeypatch.setattr(sys, "stdin", Terminal())
    typed = iter(["yes", " repair\n"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(typed))
    assert main(["wal", "check", "--repair", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    plan = out.split("  repair plan:\n")[1].splitlines()
    assert plan == [
        f"    truncate {second} at offset {damage.offset}: drops "
        f"{sizes[names[1]] - damage.offset} bytes, the entries from index {damage.index} on in "
        "that file",
        *(f"    delete {wal / n}: {sizes[n]} bytes after the damage" for n in names[2:]),
        "    WARNING: the commit index recorded after the damage is unreadable; entries this "
        "node acknowledged may be among those dropped. In a cluster, prefer replacing the "
        "member (empty data, rejoin as a learner)",
        "  not repaired",
    ], out
    assert snapshot_of(wal) == before, "anything but 'repair' typed changes nothing"
    assert main(["wal", "check", "--repair", str(tmp_path)]) == 0
    assert "repaired: the WAL opens cleanly" in capsys.readouterr().out
    assert [name for _, name in list_segments(str(wal))] == names[:2]
    kept = second.read_bytes()  # what is left of it, then zeros if the open preallocated it
    assert kept[: damage.offset] == before[names[1]][: damage.offset]
    assert kept[damage.offset :].strip(b"\0") == b""
    s = DurableStorage(str(tmp_path / "p0"))
    assert s.entries(1, s.last_index() + 1) == ents(1, damage.index - 1, 2)
    s.close()


def open_journaled(root: Path) -> tuple[Journal, DurableStorage]:
    """A node's journal and its one partition's storage, as the node opens them."""
    j = Journal(str(root / "journal"))
    s = DurableStorage(str(root / "p0"), bootstrap=ABC, journal=j.partition(0))
    j.start({0: s.wal})
    return j, s


def journaled_node(root: Path) -> None:
    """Entries 1..9 durable at the journal's last checkpoint, 10..12 written since (a journal
    record each)."""
    j, s = open_journaled(root)
    s.write(HardState(1, None, 0), ents(1, 9, 1))
    j.sync()
    j._open_segment({0: 9})  # a checkpoint at 9, as `Journal.checkpoint` makes one
    j._done()
    for i in range(10, 13):
        s.write(None, ents(i, i, 1))
        j.sync()
    s.close()
    j.close()


def test_damage_after_the_journals_checkpoint_is_a_tail_it_replays_from_any_path(tmp_path, capsys):
    """The node replays the journal over a WAL whose damage lies past the journal's last
    checkpoint: `wal check` says so, on the data directory, a partition or a WAL directory."""
    journaled_node(tmp_path)
    wal = tmp_path / "p0" / "wal"
    seg = analyze_wal(str(wal)).segments[-1]
    (eleven,) = [r for r in seg.scan.records if r.kind == fmt.T_ENTRY and r.index == 11]
    flip(Path(seg.path), eleven.offset + 12)  # a byte of entry 11, past the checkpoint's 9
    for path in (tmp_path, tmp_path / "p0", wal):
        assert main(["wal", "check", str(path)]) == 0, path
        out = capsys.readouterr().out
        assert f"journal {tmp_path / 'journal'}" in out and "after the checkpoint" in out, out
        assert "status      OK" in out and "CORRUPTED" not in out, out
        assert "to replay   3 records of 1 partitions" in out, out
    j, s = open_journaled(tmp_path)
    assert s.entries(1, 13) == ents(1, 12, 1), "the journal gives entry 11 back"
    s.close()
    j.close()


def test_a_damaged_or_unreadable_journal_is_reported_corrupted(tmp_path, capsys):
    journaled_node(tmp_path)
    journal = tmp_path / "journal"
    seg = journal / f"{list_journal(str(journal))[-1]:016x}.jrn"
    flip(seg, len(seg.read_bytes().rstrip(b"\0")) // 2)  # whole records after the damage
    assert main(["wal", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"journal {journal}\n  status      CORRUPTED: journal record checksum mismatch" in out
    seg.unlink()
    seg.mkdir()
    assert main(["wal", "check", str(tmp_path)]) == 1
    assert f"journal {journal}\n  status      CORRUPTED: unreadable (" in capsys.readouterr().out

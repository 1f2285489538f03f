"""A member whose data is partly lost refuses to start rather than vote as one that never held
anything (found by a disk-fault review: a member restarted without its partition's directory
rejoined as an empty voter, and acknowledged appends were lost)."""

from __future__ import annotations

import asyncio
import re
import shutil
from typing import Any

import pytest
from tests.server.helpers import one_node, until

from raftlog.cli.main import main
from raftlog.client import Client
from raftlog.harness.local import LocalCluster
from raftlog.node.core.raft import Role
from raftlog.node.server import main as server_main
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings
from raftlog.node.storage import snapshots
from raftlog.node.storage.errors import CorruptFile, StorageFailed


def settings(tmp_path) -> NodeSettings:
    return one_node(tmp_path, partitions=2)


async def append_and_close(node: Node) -> None:
    await node.start()
    try:
        await until(lambda: all(d.raft.role == Role.LEADER for d in node.drivers.values()), "lead")
        for d in node.drivers.values():
            await d.propose([b"acknowledged"])
    finally:
        await node.close()


@pytest.mark.parametrize("restarted", [True, False], ids=["at-a-checkpoint", "since-it"])
def test_a_partition_directory_lost_is_refused_naming_it(tmp_path, capsys, restarted):
    """Held at the journal's last checkpoint (a restart makes one), or written since it: the
    second once came back replayed into a new directory, with its vote forgotten."""
    asyncio.run(append_and_close(Node(settings(tmp_path))))
    if restarted:
        Node(settings(tmp_path)).journal.close()
    shutil.rmtree(tmp_path / "p1")
    with pytest.raises(CorruptFile, match=r"p1 is missing, while.*partition 1 held entries"):
        Node(settings(tmp_path))
    # `raftctl wal check` on the data directory says so too, and fails.
    assert main(["wal", "check", str(tmp_path)]) == 1
    held = r"up to [1-9]\d* at the checkpoint" if restarted else "written since the checkpoint"
    lost = rf"LOST        partition 1: p1/ is missing; it held entries \({held}\)\n"
    assert re.search(lost, capsys.readouterr().out)


def test_a_partition_lost_names_what_it_held_at_the_checkpoint_and_since(tmp_path):
    """Held at the last checkpoint and written since: the error says how far its log went at
    the checkpoint (what a person restoring the directory from a backup must reach), not that
    it held entries only since then."""
    asyncio.run(append_and_close(Node(settings(tmp_path))))
    asyncio.run(append_and_close(Node(settings(tmp_path))))  # its start checkpointed p1's entries
    shutil.rmtree(tmp_path / "p1")
    with pytest.raises(CorruptFile, match=r"partition 1 held entries \(up to [1-9]\d* at its last"):
        Node(settings(tmp_path))


def test_a_partition_never_written_may_be_missing(tmp_path):
    """A directory the node made but never wrote to holds nothing to lose (and a partition
    raised since the last start has none yet)."""
    node = Node(settings(tmp_path))
    node.journal.close()
    shutil.rmtree(tmp_path / "p1")
    node = Node(settings(tmp_path))
    assert node.drivers[1].storage.last_index() == 0
    node.journal.close()


class Killed(BaseException):
    """The process killed at that instant: nothing after it runs."""


def test_a_start_killed_before_a_new_partition_has_its_members_gives_them_next_time(
    tmp_path, monkeypatch
):
    """The partition count raised (2 -> 3) and the start that makes the new partition killed
    before its first snapshot (its members) is written: the next start still makes this node a
    member of that partition. It came back a member of none, for good: the directory was made
    first, and one that exists is opened as a joining member's, waiting to be added (found by
    SIGKILLing real nodes while they started with 64 partitions: 1 of 40 starts left a
    directory so, and that member never voted or counted in the partition again)."""
    asyncio.run(append_and_close(Node(settings(tmp_path))))

    def killed(*_: object) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(snapshots, "atomic_write", killed)
        with pytest.raises(Killed):
            Node(one_node(tmp_path, partitions=3))
    node = Node(one_node(tmp_path, partitions=3))
    try:
        assert node.drivers[2].storage.snapshot_meta().membership.voters == frozenset({"n1"})
    finally:
        node.journal.close()


def test_a_joining_member_that_holds_nothing_yet_bootstraps_no_partition(tmp_path):
    """Restarted before its leaders added it (its directories empty), and one partition's
    directory missing (raised since): it still waits to be added, and never starts that
    partition as a member of its own making."""
    Node(one_node(tmp_path, partitions=2, join=True)).journal.close()
    shutil.rmtree(tmp_path / "p1")
    node = Node(one_node(tmp_path, partitions=2, join=True))
    try:
        assert node.drivers[1].storage.snapshot_meta().membership.members == frozenset()
    finally:
        node.journal.close()


def test_a_garbage_holds_file_is_refused_naming_it(tmp_path):
    Node(settings(tmp_path)).journal.close()
    (tmp_path / "p0" / "holds.json").write_text("{not json")
    with pytest.raises(CorruptFile, match=r"p0/holds.json is invalid: not a list of holds"):
        Node(settings(tmp_path))


def test_a_disk_that_fails_at_start_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    def full(coro: Any, *_: object) -> None:
        coro.close()  # the node's start, which the full disk stops
        raise StorageFailed(str(tmp_path / "journal"), "write", OSError(28, "No space"))

    monkeypatch.setattr(server_main, "run", full)
    argv = ["--node-id", "n1", "--peers", "n1=http://127.0.0.1:10", "--data-dir", str(tmp_path)]
    assert server_main.main([*argv, "--insecure-no-auth"]) == 2
    err = capsys.readouterr().err
    assert f"cannot start: write of {tmp_path / 'journal'} failed: ENOSPC" in err, err


def test_a_node_on_a_lost_partition_exits_3_naming_it(tmp_path, capsys):
    """Exit 3 (a damaged or lost log, README), not 2 (bad settings, a failing disk)."""
    asyncio.run(append_and_close(Node(settings(tmp_path))))
    shutil.rmtree(tmp_path / "p1")
    argv = ["--node-id", "n1", "--peers", "n1=http://127.0.0.1:10", "--data-dir", str(tmp_path)]
    assert server_main.main([*argv, "--partitions", "2", "--insecure-no-auth"]) == 3
    assert "p1 is missing, while" in capsys.readouterr().err


@pytest.mark.parametrize("restarted", [True, False], ids=["at-a-checkpoint", "since-it"])
def test_a_node_whose_hard_state_is_lost_exits_3_naming_it(tmp_path, capsys, restarted):
    """Its entries in the partition's WAL (a restart's checkpoint wrote them there) or still in
    the journal only: either way the vote it cast is gone, and it must not vote again."""
    asyncio.run(append_and_close(Node(settings(tmp_path))))
    if restarted:
        Node(settings(tmp_path)).journal.close()
    (tmp_path / "p1" / "hardstate").unlink()
    argv = ["--node-id", "n1", "--peers", "n1=http://127.0.0.1:10", "--data-dir", str(tmp_path)]
    assert server_main.main([*argv, "--partitions", "2", "--insecure-no-auth"]) == 3
    err = capsys.readouterr().err
    assert f"{tmp_path / 'p1' / 'hardstate'} is missing, while the WAL" in err, err
    assert (tmp_path / "p0" / "hardstate").exists(), "the other partition's is untouched"


def test_a_node_started_with_fewer_partitions_than_it_holds_refuses_naming_them(tmp_path, capsys):
    """`--partitions` lowered (2 -> 1) by hand: refused, exit 2, naming the partitions held,
    and the partition left out keeps its log for a start with the right count. The node
    started and left it out: its journal's checkpoint at that start dropped the records the
    partition's WAL did not have yet, and the next start with 2 gave back a partition with a
    vote and no log (real nodes: a member holding p3 to index 6 came back at 0)."""
    asyncio.run(append_and_close(Node(settings(tmp_path))))
    with pytest.raises(ValueError, match=r"--partitions 1: .* holds partition 1 \(p1\)"):
        Node(one_node(tmp_path, partitions=1))
    argv = ["--node-id", "n1", "--peers", "n1=http://127.0.0.1:10", "--data-dir", str(tmp_path)]
    assert server_main.main([*argv, "--partitions", "1", "--insecure-no-auth"]) == 2
    err = capsys.readouterr().err
    assert "holds partition 1 (p1)" in err and "never lowered" in err, err
    node = Node(settings(tmp_path))
    try:
        assert node.drivers[1].storage.last_index() >= 2  # the election's no-op and the record
    finally:
        node.journal.close()


def test_wal_check_reports_a_nodes_only_partition_lost_rather_than_nothing_found(tmp_path, capsys):
    """Found by a review: with the node's only partition directory gone no WAL was left, and
    `wal check` said there was nothing to check (exit 2); the journal says what it held."""
    asyncio.run(append_and_close(Node(one_node(tmp_path, partitions=1))))
    shutil.rmtree(tmp_path / "p0")
    assert main(["wal", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "LOST        partition 0: p0/ is missing" in out and "CORRUPTED" in out, out


def test_a_second_node_process_on_a_data_directory_in_use_is_refused_before_opening_it(
    tmp_path, capsys
):
    """Found by a review: a restarted local operator started a second process on each live
    member's directory; it replayed the journal into the live WAL and deleted the live node's
    journal segment before it found its port taken. It is refused first, naming the holder."""
    with LocalCluster(tmp_path / "c", replicas=1, durable=False) as c:
        c.wait_ready()
        n1 = c.nodes["n1"]
        assert n1.proc is not None
        journal = sorted((n1.data_dir / "journal").iterdir())
        argv = ["--node-id", "n1", "--peers", f"n1={n1.url}", "--data-dir", str(n1.data_dir)]
        assert server_main.main([*argv, "--insecure-no-auth", "--port", "1"]) == 2
        err = capsys.readouterr().err
        assert f"is in use by another node process (pid {n1.proc.pid}" in err, err
        assert sorted((n1.data_dir / "journal").iterdir()) == journal, "nothing touched"
        with Client([n1.url]) as client:
            assert client.append(0, [{"value": "still here"}]).last_index >= 2
    # Its holder gone (the kernel lets the lock go however it ends), the directory is free.
    c.start("n1")
    c.wait_ready()
    c.stop()

"""The parts of `raftctl local up --object-store` that need no `weed` running: which binary is
used, the secrets' files and their modes, the kept ports, and the defaults of `local up`.
Each test here was missing when a planted bug in these lines passed every other test."""

from __future__ import annotations

import argparse
import os
import socket
import stat
import time
from pathlib import Path

import pytest

from raftlog.operator.local import load_manifest
from raftlog.operator.local_cli import LOCAL_ARCHIVE_BUCKET, _manifest_from_flags
from raftlog.operator.local_s3 import (
    CACHE_ENV,
    PORTS,
    WEED_ENV,
    LocalObjectStore,
    LocalS3Error,
    WeedS3,
    _dropped,
    find_weed,
)


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_weed_used_is_the_one_given_else_the_newest_cached_build_else_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WEED_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    on_path = executable(tmp_path / "bin" / "weed")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_weed() == on_path  # nothing cached
    old = executable(tmp_path / "cache" / "seaweedfs-1" / "weed")
    new = executable(tmp_path / "cache" / "seaweedfs-2" / "weed")
    os.utime(old, (time.time() - 60, time.time() - 60))
    assert find_weed() == new, "the newest cached build, not the PATH's nor an older one"
    monkeypatch.setenv(WEED_ENV, str(old))
    assert find_weed() == old
    assert find_weed(on_path) == on_path
    with pytest.raises(LocalS3Error, match=f"weed: {tmp_path} is not a file"):
        find_weed(tmp_path)


def test_weed_is_given_no_environment_it_would_take_settings_or_buckets_from() -> None:
    assert _dropped("WEED_MASTER_PORT") and _dropped("S3_BUCKET") and _dropped("S3_TABLE_BUCKET")
    assert not _dropped("AWS_REGION") and not _dropped("PATH")


def test_the_secrets_files_are_this_users_alone(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "object-store")
    creds = store.credentials_file
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.folder.stat().st_mode) == 0o700
    key, secret = creds.read_text().split()
    assert (store.server.access_key, store.server.secret_key) == (key, secret)
    store.server._write_config()
    config = store.server.dir / "s3.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and secret in config.read_text()
    # The same secret next time; a file that is not two lines is refused, naming it.
    assert LocalObjectStore(store.folder).server.secret_key == secret
    creds.write_text(f"{key}\n{secret}\nextra\n")
    with pytest.raises(LocalS3Error, match=f"{creds}: not an access key id and a secret"):
        LocalObjectStore(store.folder)


def test_the_ports_are_kept_while_every_one_is_free(tmp_path: Path) -> None:
    first = LocalObjectStore(tmp_path)._ports()
    assert set(first) == set(PORTS)
    assert LocalObjectStore(tmp_path)._ports() == first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first["s3.port"]))
        taken.listen()
        again = LocalObjectStore(tmp_path)._ports()
    assert again != first and again["s3.port"] != first["s3.port"]


def test_a_temporary_servers_folder_goes_with_it_and_a_given_one_stays(tmp_path: Path) -> None:
    temporary = WeedS3()
    assert temporary.dir.is_dir()
    temporary.stop(remove=False)  # asked to keep it
    assert temporary.dir.is_dir()
    temporary.stop()
    assert not temporary.dir.exists()
    given = WeedS3(tmp_path / "kept")
    given.dir.mkdir()
    given.stop()
    assert given.dir.is_dir()


def test_local_up_makes_three_members_and_one_partition_unless_told() -> None:
    flags = argparse.Namespace(replicas=None, partitions=None, object_store=False)
    _, spec = load_manifest(_manifest_from_flags(flags))
    assert (spec.replicas, spec.partitions, spec.archive) == (3, 1, None)
    flags = argparse.Namespace(replicas=5, partitions=4, object_store=True)
    _, spec = load_manifest(_manifest_from_flags(flags))
    assert (spec.replicas, spec.partitions) == (5, 4) and spec.archive is not None
    assert spec.archive.url == f"s3://{LOCAL_ARCHIVE_BUCKET}/local"

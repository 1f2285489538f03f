"""The real S3-compatible server of the tests (SeaweedFS's `weed`, harness `S3Server`).

Objects go in and out through obstore (the client the nodes will upload with) and are read back
through pyarrow's S3FileSystem (the one the Spark side will read archived ranges with): two
independent S3 clients agreeing on one real server, over HTTP with SigV4 signatures.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import obstore
import pyarrow.fs as pafs
import pytest
from cluster import build, layout
from obstore.exceptions import GenericError, PermissionDeniedError, UnauthenticatedError
from obstore.store import S3Store

from raftlog.harness.s3 import WEED_ENV, S3Server, S3ServerError, weed_binary

pytestmark = [pytest.mark.s3]

MiB = 1024 * 1024


def store(s3: S3Server, bucket: str, **overrides: Any) -> S3Store:
    config = {
        **s3.obstore_config(),
        "retry_config": {"max_retries": 1, "retry_timeout": timedelta(seconds=5)},
        **overrides,
    }
    return S3Store(bucket, **config)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    with S3Server(tmp_path_factory.mktemp("s3"), buckets=("objects",)) as server:
        print(f"weed answered {server.startup_seconds:.1f} s after its start")
        yield server


def test_weed_is_the_pinned_build_cached_by_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WEED_ENV, raising=False)
    weed = weed_binary()
    assert weed == layout.CACHE / f"seaweedfs-{layout.SEAWEEDFS}" / "weed"
    assert weed == build.ensure_weed()  # a second call builds nothing: the same file
    out = subprocess.run([weed, "version"], capture_output=True, text=True, check=True).stdout
    # The commit of the pseudo-version, stamped by the ldflags of `build.SEAWEEDFS`.
    assert layout.SEAWEEDFS.rsplit("-", 1)[1][:8] in out.split(), out


def test_buckets_are_made_on_request_and_exist_on_the_server(s3: S3Server) -> None:
    assert "objects" in s3.list_buckets()
    s3.create_bucket("second")
    s3.create_bucket("second")  # again: nothing to do, no error
    assert {"objects", "second"} <= set(s3.list_buckets())
    with pytest.raises(S3ServerError, match="not created"):
        s3.create_bucket("x")  # S3 bucket names have 3 to 63 characters
    obstore.put(store(s3, "second"), "a", b"in the second bucket")
    assert bytes(obstore.get(store(s3, "second"), "a").bytes()) == b"in the second bucket"
    # ... and not in the first one: buckets are separate namespaces.
    with pytest.raises(FileNotFoundError):
        obstore.get(store(s3, "objects"), "a")


def test_put_get_list_delete(s3: S3Server) -> None:
    st = store(s3, "objects")
    for i in range(5):
        obstore.put(st, f"pdl/p{i % 2}/k{i}", f"value {i}".encode(), use_multipart=False)
    assert bytes(obstore.get(st, "pdl/p1/k3").bytes()) == b"value 3"
    assert obstore.head(st, "pdl/p0/k4")["size"] == len(b"value 4")
    listed = [m["path"] for chunk in obstore.list(st, "pdl/") for m in chunk]
    assert sorted(listed) == sorted(f"pdl/p{i % 2}/k{i}" for i in range(5))
    top = obstore.list_with_delimiter(st, "pdl/")
    assert sorted(top["common_prefixes"]) == ["pdl/p0", "pdl/p1"]
    obstore.put(st, "pdl/p1/k3", b"overwritten")
    assert bytes(obstore.get(st, "pdl/p1/k3").bytes()) == b"overwritten"
    obstore.delete(st, ["pdl/p1/k1", "pdl/p1/k3"])
    left = sorted(m["path"] for chunk in obstore.list(st, "pdl/") for m in chunk)
    assert left == ["pdl/p0/k0", "pdl/p0/k2", "pdl/p0/k4"]
    with pytest.raises(FileNotFoundError):
        obstore.get(st, "pdl/p1/k1")


def test_a_multipart_upload_of_several_mib_and_ranged_reads(s3: S3Server) -> None:
    st = store(s3, "objects")
    data = os.urandom(13 * MiB + 12345)
    put = obstore.put(st, "big/segment", data, use_multipart=True, chunk_size=5 * MiB)
    # S3's ETag of a multipart object is "<md5 of the parts' md5s>-<parts>": 3 parts went up.
    assert put["e_tag"] is not None and put["e_tag"].strip('"').endswith("-3"), put
    parts = b"".join(
        hashlib.md5(data[i : i + 5 * MiB]).digest() for i in range(0, len(data), 5 * MiB)
    )
    assert put["e_tag"].strip('"') == f"{hashlib.md5(parts).hexdigest()}-3"
    assert obstore.head(st, "big/segment")["size"] == len(data)
    got = bytes(obstore.get(st, "big/segment").bytes())
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    # Ranged GETs, one inside a part and one across the boundary of the first two parts.
    assert bytes(obstore.get_range(st, "big/segment", start=100, end=200)) == data[100:200]
    edge = 5 * MiB - 10
    assert bytes(obstore.get_range(st, "big/segment", start=edge, length=20)) == data[edge:][:20]
    tail = obstore.get(st, "big/segment", options={"range": {"suffix": 7}})
    assert bytes(tail.bytes()) == data[-7:]


def test_a_missing_key_is_404_no_such_key(s3: S3Server) -> None:
    st = store(s3, "objects")
    with pytest.raises(FileNotFoundError) as e:
        obstore.get(st, "never/written")
    assert "404" in str(e.value) and "NoSuchKey" in str(e.value), e.value
    with pytest.raises(FileNotFoundError):
        obstore.head(st, "never/written")


def test_a_wrong_secret_key_is_refused(s3: S3Server) -> None:
    wrong = store(s3, "objects", secret_access_key=s3.secret_key + "x")
    refused = (PermissionDeniedError, UnauthenticatedError, GenericError)
    with pytest.raises(refused) as e:
        obstore.put(wrong, "forged", b"x", use_multipart=False)
    assert "403" in str(e.value) and "SignatureDoesNotMatch" in str(e.value), e.value
    with pytest.raises(refused) as e:
        obstore.get(wrong, "pdl/p0/k0")
    assert "403" in str(e.value), e.value
    unknown = store(s3, "objects", access_key_id="nobody")
    with pytest.raises(refused) as e:
        obstore.get(unknown, "pdl/p0/k0")
    assert "403" in str(e.value) and "InvalidAccessKeyId" in str(e.value), e.value
    # Nothing was written by the refused put.
    with pytest.raises(FileNotFoundError):
        obstore.get(store(s3, "objects"), "forged")


def test_pyarrow_s3_filesystem_reads_what_obstore_wrote(s3: S3Server) -> None:
    st = store(s3, "objects")
    data = os.urandom(6 * MiB + 1)
    obstore.put(st, "arrow/archived-range", data, chunk_size=5 * MiB)
    obstore.put(st, "arrow/small", b"small one", use_multipart=False)
    fs = pafs.S3FileSystem(**s3.pyarrow_options())
    infos = fs.get_file_info(pafs.FileSelector("objects/arrow"))
    assert sorted((i.base_name, i.size) for i in infos) == [
        ("archived-range", len(data)),
        ("small", len(b"small one")),
    ]
    with fs.open_input_file("objects/arrow/archived-range") as f:
        assert f.size() == len(data)
        assert f.read_at(16, 5 * MiB - 8) == data[5 * MiB - 8 : 5 * MiB + 8]
        f.seek(0)
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    with fs.open_input_stream("objects/arrow/small") as f:
        assert f.read() == b"small one"
    assert fs.get_file_info("objects/arrow/never").type == pafs.FileType.NotFound
    # A wrong secret is refused to pyarrow too.
    wrong = pafs.S3FileSystem(**{**s3.pyarrow_options(), "secret_key": "wrong"})
    with pytest.raises(OSError, match=r"403|SignatureDoesNotMatch|ACCESS_DENIED"):
        wrong.open_input_stream("objects/arrow/small").read()


def sockets(s3: S3Server) -> list[Path]:
    """The Unix sockets weed made for `s3`'s ports under /tmp."""
    return [p for port in s3.ports.values() for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]


@pytest.mark.slow
def test_objects_outlive_a_restart_on_the_same_data_dir(tmp_path: Path) -> None:
    data = os.urandom(7 * MiB)
    with S3Server(tmp_path, buckets=("durable",)) as first:
        obstore.put(store(first, "durable"), "seg/1", data, chunk_size=5 * MiB)
        obstore.put(store(first, "durable"), "seg/2", b"second", use_multipart=False)
        first_ports = dict(first.ports)
    assert not first.running
    # A new server on the same folder (new ports): the bucket and both objects are there.
    with S3Server(tmp_path) as second:
        assert second.ports != first_ports
        assert "durable" in second.list_buckets()
        st = store(second, "durable")
        assert sorted(m["path"] for chunk in obstore.list(st) for m in chunk) == ["seg/1", "seg/2"]
        assert hashlib.sha256(bytes(obstore.get(st, "seg/1").bytes())).digest() == (
            hashlib.sha256(data).digest()
        )
        assert bytes(obstore.get(st, "seg/2").bytes()) == b"second"
        obstore.put(st, "seg/3", b"after the restart", use_multipart=False)
        # SIGKILLed (a crash) and started again, its own ports kept: what it acknowledged is there.
        second.kill()
        assert not second.running
        second.start()
        st = store(second, "durable")
        assert bytes(obstore.get(st, "seg/3").bytes()) == b"after the restart"
        assert obstore.head(st, "seg/1")["size"] == len(data)


def test_a_stopped_server_is_gone_and_a_temporary_one_leaves_nothing() -> None:
    s3 = S3Server()
    with s3:
        assert s3.running and s3.dir.exists()
        assert sockets(s3)
        pid = s3.proc.pid if s3.proc else -1
    assert not s3.running and not s3.dir.exists()
    assert not sockets(s3)  # weed leaves the admin's behind: the harness removes it
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    st = store(s3, "objects", retry_config={"max_retries": 0})
    with pytest.raises((GenericError, OSError)):
        obstore.get(st, "anything")


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    with S3Server(tmp_path / "a", buckets=("still",)) as running:
        # A second server on the first one's S3 port: weed cannot bind it and exits.
        clash = S3Server(tmp_path / "b", start_timeout=30)
        clash.ports["s3.port"] = running.ports["s3.port"]
        with pytest.raises(S3ServerError, match="exited") as e:
            clash.start()
        assert str(running.ports["s3.port"]) in str(e.value)  # the log's tail names the port
        assert not clash.running
        # The first one is untouched, its sockets too (the shared port's among them).
        assert running.running and sockets(running)
        obstore.put(store(running, "still"), "k", b"v", use_multipart=False)
        assert bytes(obstore.get(store(running, "still"), "k").bytes()) == b"v"

"""`raftlog-operator`'s own choices, without an API server."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from raftlog.operator import handlers
from raftlog.operator import main as main_module
from raftlog.operator.actions import ChangeMembership, InstallSnapshot
from raftlog.operator.main import default_priority, parse_args
from raftlog.operator.models import RaftClusterStatus
from raftlog.operator.nodeapi import MemberTls


def test_replicas_never_tie_on_the_default_priority() -> None:
    # kopf pauses every operator of a tied priority, for good; its own default is 0 for all.
    drawn = {default_priority() for _ in range(50)}
    assert len(drawn) > 45 and all(1 <= p < 2**31 for p in drawn)


def test_an_operator_run_by_hand_is_standalone_and_peers_only_when_named() -> None:
    """Found by a review: `--peering` defaulted to a name, and kopf pauses a peering operator
    until that KopfPeering object exists, so `raftlog-operator -n NS` reconciled nothing."""
    args = parse_args(["-n", "ns"])
    assert args.peering is None and args.namespace == ["ns"]
    assert parse_args(["-n", "ns", "--standalone"]).peering is None
    assert parse_args(["-A", "--peering", "ops", "--priority", "7"]).peering == "ops"


@pytest.mark.parametrize(
    ("argv", "standalone", "peering"),
    [
        (["-n", "ns"], True, None),
        (["-n", "ns", "--standalone"], True, None),
        (["-A", "--peering", "ops"], False, "ops"),
    ],
)
def test_kopf_is_told_to_peer_only_when_a_peering_is_named(
    argv: list[str], standalone: bool, peering: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: dict[str, Any] = {}

    async def operator(**kw: Any) -> None:
        told.update(kw)

    monkeypatch.setattr(kopf, "operator", operator)
    assert main_module.main([*argv, "--log-level", "WARNING"]) == 0
    assert (told["standalone"], told["peering_name"]) == (standalone, peering)
    assert told["clusterwide"] == ("-A" in argv)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["-n", "ns", "--standalone", "--peering", "ops"], "not allowed with argument"),
        (["-n", "ns", "--priority", "3"], "--priority is a peering priority"),
        ([], "give --namespace NS"),
    ],
)
def test_operator_flags_that_cannot_work_are_refused_with_the_reason(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err


# ----------------------------------------------------------------------------- the handlers
class _StatusApi:
    """`CustomObjectsApi.patch_namespaced_custom_object_status` as the API server answers it:
    the patch kept, the new resourceVersion back, or an HTTP error."""

    def __init__(self, error: int | None = None) -> None:
        self.error = error
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def patch_namespaced_custom_object_status(self, *args: Any, **kw: Any) -> Any:
        self.calls.append((args, kw))
        if self.error is not None:
            raise ApiException(status=self.error, reason="Conflict")
        return SimpleNamespace(data=json.dumps({"metadata": {"resourceVersion": "8"}}).encode())


def saving(
    monkeypatch: pytest.MonkeyPatch,
    api: _StatusApi,
    version: str | None,
    status: RaftClusterStatus | None = None,
    on_server: dict[str, Any] | None = None,
) -> str:
    monkeypatch.setattr(handlers, "_api", object())
    monkeypatch.setattr(k8s, "CustomObjectsApi", lambda _: api)  # the module handlers calls
    dumped = (status or RaftClusterStatus(phase="Running")).model_dump(mode="json", by_alias=True)
    return asyncio.run(handlers._save_status("c", "ns", dumped, on_server or {}, version))


def test_a_partition_no_longer_led_leaves_status_leaders() -> None:
    """Found by a review: the status went as a merge patch of the new status alone, so a key
    the new `leaders` lacked stayed on the server (a hibernated cluster showed its old
    leaders)."""
    old = {"phase": "Running", "leaders": {"0": "c-0", "1": "c-1"}, "gone": 1, "members": [1]}
    new = {"phase": "Hibernated", "leaders": {"1": "c-2"}, "members": []}
    assert handlers.merge_patch(old, new) == {
        "phase": "Hibernated",
        "leaders": {"0": None, "1": "c-2"},
        "gone": None,
        "members": [],
    }
    assert handlers.merge_patch({"leaders": {"0": "c-0"}}, {"leaders": {}}) == {
        "leaders": {"0": None}
    }


def test_the_status_patch_deletes_what_the_server_holds_and_the_new_status_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = _StatusApi()
    on_server = {"phase": "Running", "leaders": {"0": "c-0"}}
    saving(monkeypatch, api, "7", RaftClusterStatus(phase="Hibernated"), on_server)
    ((args, _),) = api.calls
    assert args[-1]["status"]["leaders"] == {"0": None}
    assert args[-1]["status"]["phase"] == "Hibernated"


def test_the_status_is_written_only_over_the_version_it_was_made_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Optimistic concurrency: another writer since makes the API server refuse it (409).
    api = _StatusApi()
    assert saving(monkeypatch, api, "7") == "8"
    ((args, kw),) = api.calls
    assert args[-1]["metadata"] == {"resourceVersion": "7"}
    assert args[-1]["status"]["phase"] == "Running"
    assert kw["_content_type"] == "application/merge-patch+json"


@pytest.mark.parametrize(("code", "raised"), [(409, handlers.StaleStatus), (500, ApiException)])
def test_only_a_conflict_makes_the_pass_read_the_status_again(
    monkeypatch: pytest.MonkeyPatch, code: int, raised: type[Exception]
) -> None:
    with pytest.raises(raised) as e:
        saving(monkeypatch, _StatusApi(error=code), "7")
    assert type(e.value) is raised


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_promotions_and_installs_are_counted_by_their_outcome() -> None:
    promote = ChangeMembership(0, "c-0", "promote", "c-3")
    before = _sample("raftlog_operator_promotions_total")
    handlers._count(promote, ok=False)  # refused by the leader: not a promotion
    assert _sample("raftlog_operator_promotions_total") == before
    handlers._count(promote, ok=True)
    assert _sample("raftlog_operator_promotions_total") == before + 1
    failed = _sample("raftlog_operator_snapshot_installs_total", result="failed")
    handlers._count(InstallSnapshot(0, "c-0", "c-2", "leader"), ok=False)
    assert _sample("raftlog_operator_snapshot_installs_total", result="failed") == failed + 1


def test_a_tls_cluster_is_called_verifying_its_ca_and_showing_its_certificate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(handlers, "NodeApi", lambda **kw: made.append(kw))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    handlers._node_api("t", MemberTls(ca="CA", cert="CERT", key="KEY"), "c", "ns")
    handlers._node_api("t", None, "c", "ns")
    tls, plain = made
    assert [Path(tls[k]).read_text() for k in ("ca_file", "cert_file", "key_file")] == [
        "CA",
        "CERT",
        "KEY",
    ]
    assert tls["token"] == "t" and plain == {"token": "t"}

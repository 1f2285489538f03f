"""The node's settings: flags over environment over file, validated with the field named."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from raftlog.node.core.config import describe_validation_error
from raftlog.node.server.main import build_parser, main
from raftlog.node.settings import NodeSettings, load_settings

PEERS = {"n1": "http://127.0.0.1:7001", "n2": "http://127.0.0.1:7002"}
OPEN = {"insecure_no_auth": True}


def test_flags_win_over_environment_over_file(tmp_path, monkeypatch):
    config = tmp_path / "node.json"
    config.write_text(
        json.dumps({"node_id": "n1", "peers": PEERS, "data_dir": "/x", "port": 1, **OPEN})
    )
    monkeypatch.setenv("RAFTLOG_PORT", "2")
    monkeypatch.setenv("RAFTLOG_RAFT__BACKFILL_THRESHOLD", "20")
    s = load_settings({"tick_ms": 25}, str(config))
    assert (s.port, s.tick_ms, s.raft.backfill_threshold) == (2, 25, 20)
    assert load_settings({"port": 3}, str(config)).port == 3


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"node_id": "n9"}, "is not among the peers"),
        ({"peers": {"n1": "ftp://x"}}, "peers"),
        ({"port": 0}, "port"),
        ({"raft": {"heartbeat_ticks": 50}}, "raft"),
        ({"colour": "red"}, "colour"),
        ({"event_loop": "trio"}, "event_loop"),
        ({"port": 7001, "peer_port": 7001}, "peer_port: 7001 is also the client port"),
        (
            {"max_request_bytes": 1 << 20, "raft": {"max_append_bytes": 600_000}},
            "raft.max_append_bytes (600000) must be at most half of max_request_bytes",
        ),
        ({"raft": {"max_append_bytes": 1 << 30}}, "must be at most max_message_bytes"),
    ],
)
def test_bad_settings_name_the_field(tmp_path, values, field):
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), **OPEN}
    with pytest.raises(ValidationError) as info:
        load_settings({**base, **values})
    assert field in describe_validation_error(info.value)


def test_appends_follow_a_smaller_request_limit_unless_set(tmp_path):
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), **OPEN}
    assert load_settings(base).raft_config().max_append_bytes == 1 << 20
    small = load_settings({**base, "max_request_bytes": 65536})
    assert small.raft_config().max_append_bytes == 32768


def test_tls_needs_certificate_and_key_together(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), **OPEN}
    with pytest.raises(ValidationError, match="give both or neither"):
        load_settings({**base, "tls_cert_file": str(cert)})


def test_client_certificates_need_the_ca_a_certificate_and_a_peer_port(tmp_path):
    pem = tmp_path / "c.pem"
    pem.write_text("x")
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), **OPEN}
    with pytest.raises(ValidationError, match="needs tls_cert_file and tls_ca_file and peer_port"):
        load_settings({**base, "peer_client_cert_auth": True})
    tls = {"tls_cert_file": str(pem), "tls_key_file": str(pem), "tls_ca_file": str(pem)}
    with pytest.raises(ValidationError, match="peer_client_cert_auth: needs peer_port"):
        load_settings({**base, **tls, "peer_client_cert_auth": True})


def test_the_node_refuses_to_start_on_bad_settings(tmp_path, capsys):
    code = main(
        ["--node-id", "n9", "--peers", "n1=http://127.0.0.1:1", "--data-dir", str(tmp_path)]
    )
    assert code == 2
    assert "invalid settings" in capsys.readouterr().err


def test_a_leader_hint_names_the_client_port_when_peers_have_their_own():
    base = {"node_id": "n1", "data_dir": "/x", "port": 7001, "peer_port": 7002, **OPEN}
    split = load_settings({**base, "peers": {"n1": "http://10.0.0.1:7002"}})
    assert (
        split.client_url_of("https://m-0.c-peers.ns.svc:7002") == "https://m-0.c-peers.ns.svc:7001"
    )
    assert split.client_url_of("http://[::1]:7002") == "http://[::1]:7001"
    # A peer URL on some other port is not guessed at.
    assert split.client_url_of("http://10.0.0.2:9000") == "http://10.0.0.2:9000"
    one_port = load_settings({**base, "peer_port": None, "peers": PEERS})
    assert one_port.client_url_of("http://127.0.0.1:7002") == "http://127.0.0.1:7002"


def test_a_node_without_a_token_refuses_to_start_unless_told_it_is_insecure(tmp_path, capsys):
    args = ["--node-id", "n1", "--peers", "n1=http://127.0.0.1:1", "--data-dir", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "auth_token_file" in err and "--insecure-no-auth" in err, err
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path)}
    assert load_settings({**base, **OPEN}).insecure_no_auth
    token = tmp_path / "token"
    token.write_text("t")
    with pytest.raises(ValidationError, match="give one of them"):
        load_settings({**base, **OPEN, "auth_token_file": str(token)})
    assert load_settings({**base, "auth_token_file": str(token)}).token() == "t"


def test_help_documents_every_setting_with_its_flag_environment_and_default(capsys):
    from raftlog.node.core.config import RaftConfig
    from raftlog.node.settings import NodeSettings

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, field in NodeSettings.model_fields.items():
        if name == "raft":
            continue
        assert f"--{name.replace('_', '-')}" in text, name
        assert f"env RAFTLOG_{name.upper()};" in text, name
        assert " ".join((field.description or "").split())[:40] in text, name
    for name in RaftConfig.model_fields:
        assert f"RAFTLOG_RAFT__{name.upper()} (default" in text, name
    assert "default 7001" in text and 'default "uvloop"' in text and "default unset" in text


def test_a_mapping_setting_is_a_json_flag_as_its_environment_variable(tmp_path, capsys):
    """`--restore-indexes` takes the JSON its RAFTLOG_ variable takes (a plain string reached the
    settings before, refused as "not a valid dictionary"); what is not JSON is refused, naming
    the flag, and the help shows its default as {}, not "required"."""
    argv = ["--node-id", "n1", "--peers", "n1=http://127.0.0.1:1", "--data-dir", str(tmp_path)]
    argv += ["--insecure-no-auth", "--partitions", "2", "--restore-url", "s3://b/p"]
    argv += ["--restore-indexes"]
    args = build_parser().parse_args([*argv, '{"0": 5, "1": 0}'])
    flags = {k: getattr(args, k) for k in NodeSettings.model_fields}
    assert load_settings(flags).restore_indexes == {0: 5, 1: 0}
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "0=5"])
    assert "argument --restore-indexes: '0=5' is not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "RAFTLOG_RESTORE_INDEXES; default {}]" in text
    assert "--log-level {DEBUG,INFO,WARNING,ERROR}" in text


def test_peers_are_name_url_pairs_separated_by_commas_and_spaces(capsys):
    args = build_parser().parse_args(["--peers", "n1=http://a:1, n2=http://b:2 ,n3=http://c:3"])
    assert args.peers == {"n1": "http://a:1", "n2": "http://b:2", "n3": "http://c:3"}
    for bad in ("n1=", "=http://a:1", "n1"):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(["--peers", f"n0=http://z:1,{bad}"])
        assert info.value.code == 2
        assert f"{bad!r} is not NAME=URL" in capsys.readouterr().err, bad


def test_peer_urls_are_kept_without_a_trailing_slash(tmp_path):
    peers = {"n1": "http://127.0.0.1:7001/", "n2": "https://n2.example:7002//"}
    s = load_settings({"node_id": "n1", "peers": peers, "data_dir": str(tmp_path), **OPEN})
    assert s.peers == {"n1": "http://127.0.0.1:7001", "n2": "https://n2.example:7002"}


def test_a_token_file_is_read_without_its_newline_and_an_empty_one_is_refused(tmp_path):
    token = tmp_path / "token"
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), "auth_token_file": token}
    token.write_text("s3cret\n")
    assert load_settings(base).token() == "s3cret"
    token.write_text(" \n")
    with pytest.raises(ValueError, match=f"auth_token_file: {token} is empty"):
        load_settings(base).token()


def test_restore_indexes_need_a_restore_url(tmp_path):
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), **OPEN}
    with pytest.raises(ValidationError, match=r"restore_indexes: set, but restore_url \(where"):
        load_settings({**base, "restore_indexes": {0: 5}})


def test_only_the_peer_listener_asks_for_client_certificates(tmp_path):
    import ssl

    import trustme

    ca = trustme.CA()
    cert, key, ca_file = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem"
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    tls = {"tls_cert_file": cert, "tls_key_file": key, "tls_ca_file": ca_file}
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), **OPEN, **tls}
    s = load_settings({**base, "peer_port": 7002, "peer_client_cert_auth": True})
    client, peer = s.server_ssl(), s.server_ssl(peer=True)
    assert client is not None and client.verify_mode == ssl.CERT_NONE
    assert peer is not None and peer.verify_mode == ssl.CERT_REQUIRED


def test_a_config_file_that_is_not_there_is_refused_naming_it(tmp_path):
    base = {"node_id": "n1", "peers": PEERS, "data_dir": str(tmp_path), **OPEN}
    missing = tmp_path / "nowhere.json"
    with pytest.raises(ValueError, match=f"config: {missing} is not a file"):
        load_settings(base, str(missing))

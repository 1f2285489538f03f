"""The README's configuration reference is the one the models generate."""

from __future__ import annotations

import pytest
from tests.chart.helm import ROOT

from raftlog.operator import docs
from raftlog.operator.models import RaftClusterSpec

pytestmark = pytest.mark.chart


def test_the_readme_configuration_reference_is_up_to_date():
    readme = (ROOT / "README.md").read_text()
    assert docs.section(readme) == docs.render(), (
        "README.md's configuration reference is stale: run "
        "`python -m raftlog.operator.docs --write README.md` and commit it"
    )


def test_the_reference_names_every_spec_field_with_its_default_and_bounds():
    text = docs.render()
    schema = RaftClusterSpec.model_json_schema(by_alias=True)
    for section in ("raft", "storage", "resources", "podTemplate"):
        ref = schema["properties"][section]["$ref"].split("/")[-1]
        for name in schema["$defs"][ref]["properties"]:
            assert f"| `spec.{section}.{name}` |" in text
    replicas = "Voting members of every partition. (>= 1; <= 15)"
    assert f"| `spec.replicas` | integer | `3` | {replicas} |" in text
    assert '| `spec.storage.reclaimPolicy` | `Delete` \\| `Retain` | `"Delete"` |' in text
    assert "| `spec.storage.storageClassName` | string (optional) | unset |" in text
    assert "| `RAFTLOG_OPERATOR_INTERVAL_S` | float | `1.0` |" in text


def test_write_replaces_only_the_section(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text(f"# before\n\n{docs.BEGIN}\nstale text\n{docs.END}\n\n## after\n")
    assert docs.main(["--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"# before\n\n{docs.BEGIN}\n") and text.endswith(
        f"{docs.END}\n\n## after\n"
    )
    assert docs.section(text) == docs.render() and "stale text" not in text
    with pytest.raises(ValueError, match="markers"):
        docs.section("no markers here")


def _api_reference(readme: str) -> list[str]:
    """The table rows of the README's API reference (its client and admin API tables)."""
    section = readme[readme.index("## API reference") : readme.index("## Configuration reference")]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_api_reference_names_every_client_and_admin_route():
    """Each route a node serves under /v1 (and its health and metrics) is in a row of the API
    reference that names its method; the peer routes (/peer/) are the members' own."""
    from types import SimpleNamespace

    from raftlog.node.server.app import build_app

    node = SimpleNamespace(token=None, settings=SimpleNamespace(max_request_bytes=1 << 20))
    rows = _api_reference((ROOT / "README.md").read_text())
    missing = []
    for route in build_app(node).router.routes():  # type: ignore[arg-type]
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "HEAD" or path.startswith("/peer/"):
            continue
        path = path.replace("{partition}", "{p}").replace("{follower}", "{node}")
        tail = "/".join(path.split("/")[-2:])
        named = [
            row
            for row in rows
            if f"{path}`" in row or f"{path}?" in row or f".../{tail}`" in row
            or (path.count("/") == 1 and f"`{path}`" in row)
        ]  # fmt: skip
        if not any(route.method in row.split(" | ")[0] for row in named):
            missing.append(f"{route.method} {path}")
    assert not missing, f"routes the README's API reference does not name: {missing}"

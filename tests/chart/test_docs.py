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

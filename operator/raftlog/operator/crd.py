"""The `RaftCluster` CRD, generated from the pydantic models.

`python -m raftlog.operator.crd` prints it; `python -m raftlog.operator.crd --write` rewrites
`crds/raftclusters.raftlog.dev.yaml` and the chart's copy (tests fail when either is stale).

pydantic emits JSON Schema 2020-12 with `$ref`s; a CRD needs a structural OpenAPI v3.0 schema:
everything inlined, a `type` on every node, `nullable` instead of `anyOf [..., null]`, boolean
`exclusiveMinimum`, and no `additionalProperties: false` beside `properties`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from raftlog.operator.models import (
    GROUP,
    KIND,
    NAME_MESSAGE,
    NAME_RULE,
    PLURAL,
    SHORT_NAMES,
    VERSION,
    RaftClusterSpec,
    RaftClusterStatus,
)

CRD_PATH = Path("crds") / f"{PLURAL}.{GROUP}.yaml"
# The chart ships a copy (Helm installs a chart's crds/ folder); both are written together.
CHART_CRD_PATH = Path("charts") / "raftlog-operator" / CRD_PATH

_KEEP = {
    "type", "description", "default", "enum", "pattern", "minimum", "maximum", "minLength",
    "maxLength", "minItems", "maxItems", "format",
    # CEL rules of a field (models.py `_rules`), e.g. the transition rules of what is fixed.
    "x-kubernetes-validations",
}  # fmt: skip


def openapi(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON schema node as a structural OpenAPI v3.0 schema node."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return openapi(merged, defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {len(options)} types in a CRD")
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        out = openapi({**options[0], **rest}, defs)
        if len(options) < len(schema["anyOf"]):
            out["nullable"] = True
        return out
    node: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEEP}
    if "const" in schema:
        node["enum"] = [schema["const"]]
    if "exclusiveMinimum" in schema:
        node["minimum"], node["exclusiveMinimum"] = schema["exclusiveMinimum"], True
    if "exclusiveMaximum" in schema:
        node["maximum"], node["exclusiveMaximum"] = schema["exclusiveMaximum"], True
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props:
            node["properties"] = {k: openapi(v, defs) for k, v in props.items()}
            for name, prop in node["properties"].items():
                # Nested objects default to {} so the API server fills in their defaults.
                if (
                    prop.get("type") == "object"
                    and "properties" in prop
                    and "default" not in prop
                    and name not in schema.get("required", [])
                    and not prop.get("nullable")
                ):
                    prop["default"] = {}
            if schema.get("required"):
                node["required"] = list(schema["required"])
        elif isinstance(extra, dict) and extra.get("type") not in (None, "object"):
            node["additionalProperties"] = openapi(extra, defs)
        else:
            node["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        node["items"] = openapi(schema.get("items", {"type": "object"}), defs)
    elif kind is None and "enum" in node:
        node["type"] = "string"
    if node.get("default", 0) is None:
        del node["default"]  # null is what an absent optional field means anyway
    order = ["type", "description"]
    return {k: node[k] for k in order if k in node} | {
        k: v for k, v in node.items() if k not in order
    }


def _schema_of(model: type[RaftClusterSpec] | type[RaftClusterStatus]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return openapi(raw, raw.get("$defs", {}))


def build_crd() -> dict[str, Any]:
    spec = _schema_of(RaftClusterSpec)
    status = _schema_of(RaftClusterStatus)
    # kopf keeps its own bookkeeping under status; the API server must not prune it.
    status["x-kubernetes-preserve-unknown-fields"] = True
    version = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "description": "A replicated, partitioned raftlog cluster.",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {**spec, "default": {}},
                    "status": status,
                },
                "required": ["spec"],
                "x-kubernetes-validations": [{"rule": NAME_RULE, "message": NAME_MESSAGE}],
            }
        },
        "subresources": {
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
        "additionalPrinterColumns": [
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
            {"name": "Partitions", "type": "integer", "jsonPath": ".spec.partitions"},
            {"name": "Leaders", "type": "string", "jsonPath": ".status.leaderSummary"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {
                "name": "Available",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Available")].status',
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
                "listKind": f"{KIND}List",
            },
            "versions": [version],
        },
    }


def render() -> str:
    header = (
        "# Generated by `python -m raftlog.operator.crd --write` from raftlog.operator.models.\n"
    )
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftlog.operator.crd", description=__doc__)
    parser.add_argument(
        "--write", action="store_true", help=f"rewrite {CRD_PATH} and {CHART_CRD_PATH}"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        for path in (CRD_PATH, CHART_CRD_PATH):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The chart's RBAC read as the API server's RBAC authorizer reads it, statically: roles are
scoped to their namespace, and a standalone operator gets the HA grants minus peering. The
operator's real traffic against these roles is checked on the real cluster, from its audit log
(tests/k8s/test_rbac.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from tests.chart.helm import objects

pytestmark = pytest.mark.chart

SA = ("raftlog-system", "raftlog-operator")  # the chart's ServiceAccount (namespace, name)
NS = "default"
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# chart mode -> values; both with two replicas, so with peering (the HA configuration).
MODES: dict[str, dict[str, Any]] = {
    "cluster": {"watch": {"mode": "cluster"}, "replicaCount": 2},
    "namespaced": {"watch": {"mode": "namespaced", "namespaces": [NS]}, "replicaCount": 2},
}


@dataclass(frozen=True)
class Call:
    group: str
    resource: str  # with "/subresource" when there is one
    verb: str
    namespace: str | None  # None: cluster-scoped, or across every namespace


def _grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


class Rbac:
    """The rendered roles as the API server's RBAC authorizer reads them for the operator."""

    def __init__(self, objs: list[dict[str, Any]]) -> None:
        subject = {"kind": "ServiceAccount", "namespace": SA[0], "name": SA[1]}
        roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
                 for o in objs if o["kind"] in ("Role", "ClusterRole")}  # fmt: skip
        self.cluster: set[Grant] = set()
        self.namespaced: dict[str, set[Grant]] = {}
        for b in objs:
            if (
                b["kind"] not in ("RoleBinding", "ClusterRoleBinding")
                or subject not in b["subjects"]
            ):
                continue
            ref = b["roleRef"]
            ns = b["metadata"].get("namespace")
            rules = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
            if b["kind"] == "ClusterRoleBinding":
                self.cluster |= _grants(rules)
            else:
                self.namespaced.setdefault(ns, set()).update(_grants(rules))

    def allows(self, call: Call) -> bool:
        grant = (call.group, call.resource, call.verb)
        if grant in self.cluster:
            return True
        return call.namespace is not None and grant in self.namespaced.get(call.namespace, set())

    def granted(self) -> set[Grant]:
        return self.cluster.union(*self.namespaced.values())


def test_the_rbac_reading_scopes_roles_to_their_namespace():
    rbac = Rbac(objects(MODES["namespaced"]))
    assert rbac.allows(Call("", "pods", "create", NS))
    assert not rbac.allows(Call("", "pods", "create", "kube-system"))  # a Role's namespace only
    assert not rbac.allows(Call("", "pods", "list", None))  # not across namespaces
    assert not rbac.allows(Call("", "namespaces", "watch", None))  # nothing cluster-scoped
    assert not rbac.allows(Call("", "secrets", "list", NS))  # get, never list
    cluster = Rbac(objects(MODES["cluster"]))
    assert cluster.allows(Call("", "pods", "list", None)) and not cluster.allows(
        Call("", "namespaces", "list", None)
    )


@pytest.mark.parametrize("mode", ["default", "cluster"])
def test_a_standalone_operator_gets_the_same_grants_without_peering(mode):
    values: dict[str, Any] = {} if mode == "default" else {"watch": {"mode": "cluster"}}
    ha = MODES["namespaced" if mode == "default" else "cluster"]
    peering = {g for g in Rbac(objects(ha)).granted() if g[0] == "kopf.dev"}
    assert peering and Rbac(objects(values)).granted() == Rbac(objects(ha)).granted() - peering

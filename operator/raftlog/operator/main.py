"""`raftlog-operator`: the kopf operator of RaftCluster resources."""

from __future__ import annotations

import argparse
import asyncio
import logging
import random

import kopf

from raftlog.operator import handlers  # noqa: F401  (registers the handlers)


def default_priority() -> int:
    """Random: replicas of one Deployment never tie (kopf pauses all operators of a tie)."""
    return random.randint(1, 2**31 - 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raftlog-operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    # Peering only when named: kopf pauses a peering operator until its KopfPeering object
    # exists, so a default name would leave an operator run by hand doing nothing, silently.
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone",
        action="store_true",
        help="no peering with other operator replicas (the default; run only one replica)",
    )
    peering.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="peer with other replicas through this KopfPeering (or ClusterKopfPeering with "
        "--all-namespaces) object, which must exist: kopf pauses the operator until it does",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority: the highest live one works, the others stand by (default: "
        "random, so that replicas never tie; kopf pauses every operator of a tied priority)",
    )
    parser.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="kopf's liveness endpoint"
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if not args.namespace and not args.all_namespaces:
        parser.error("give --namespace NS (repeatable) or --all-namespaces")
    if args.priority is not None and args.peering is None:
        parser.error("--priority is a peering priority: give --peering NAME with it")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = kopf.OperatorSettings()
    # Watched namespaces are exact names: kopf need not list and watch namespaces and CRDs, so a
    # namespaced operator needs no cluster-scoped grant at all (the CRD exists before it starts).
    settings.scanning.disabled = not args.all_namespaces
    asyncio.run(
        kopf.operator(
            settings=settings,
            clusterwide=args.all_namespaces,
            namespaces=args.namespace,
            standalone=args.peering is None,
            # A peering name makes peering mandatory in kopf.
            peering_name=args.peering,
            priority=args.priority if args.priority is not None else default_priority(),
            liveness_endpoint=args.liveness or None,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One DNS question to the cluster's DNS Service, from the host (through kube-proxy's rules)."""

from __future__ import annotations

import dns.message
import dns.query
import dns.rdatatype


def resolve(name: str, server: str, timeout: float = 2.0) -> str | None:
    """The first A record of `name` at `server`, or None."""
    answer = dns.query.udp(dns.message.make_query(name, dns.rdatatype.A), server, timeout=timeout)
    for rrset in answer.answer:
        for rr in rrset:
            if rr.rdtype == dns.rdatatype.A:
                return str(rr.address)
    return None

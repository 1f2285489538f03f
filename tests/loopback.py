"""Loopback addresses for tests whose nodes must each have an address of their own."""

from __future__ import annotations

import random
import socket


def free_loopback_net(members: int = 8, ports: tuple[int, ...] = (7001, 7002)) -> int:
    """A second octet N such that 127.N.i.1 has every one of `ports` free for i < `members`: the
    pods of one test, each on its own address (members' client and peer ports). Drawn from the
    OS's randomness (a seeded `random` could give two xdist workers the same net) and checked by
    binding each address."""
    rng = random.SystemRandom()
    for _ in range(200):
        net = rng.randint(2, 254)
        socks = []
        try:
            for i in range(members):
                for port in ports:
                    s = socket.socket()
                    socks.append(s)
                    s.bind((f"127.{net}.{i}.1", port))
            return net
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no free 127.N.i.1 with ports {ports} for {members} members")

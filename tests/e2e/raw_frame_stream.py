"""A peer frame stream's handshake from a raw socket, for tests of what a node answers."""

from __future__ import annotations

import socket

from raftlog.node.transport.frames import handshake


def open_frame_stream(
    host: str, port: int, token: str | None, node: str | None = None
) -> tuple[socket.socket, int, bytes]:
    """(the socket, the answer's status, the answer's head); `node`: the node meant."""
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(handshake(host, port, token, node))
    answer = b""
    while b"\r\n\r\n" not in answer:
        piece = s.recv(4096)
        assert piece, f"closed before answering: {answer!r}"
        answer += piece
    head = answer.split(b"\r\n\r\n")[0]
    return s, int(head.split(b" ")[1]), head

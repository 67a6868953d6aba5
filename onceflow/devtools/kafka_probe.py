"""Ask a Kafka-protocol broker which brokers it advertises, with one raw Metadata v0 request.

A raw request rather than aiokafka keeps this usable from inside a running
event loop (async tests) and shows the advertised listener, which is what
clients will connect to (a proxy in front of the broker in outage tests).
"""

from __future__ import annotations

import socket
import struct

_CORRELATION = 7


def advertised_brokers(host: str, port: int, timeout: float = 2.0) -> set[tuple[str, int]]:
    """The (host, port) of every broker in the reply; OSError or ValueError if there is none."""
    client = b"onceflow-probe"
    body = struct.pack(">hhih", 3, 0, _CORRELATION, len(client)) + client + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        reply = _recv_exact(sock, size)
    correlation, brokers = struct.unpack_from(">ii", reply, 0)
    if correlation != _CORRELATION:
        raise ValueError(f"reply to request {correlation}, not to {_CORRELATION}")
    advertised = set()
    offset = 8
    for _ in range(brokers):
        host_len = struct.unpack_from(">ih", reply, offset)[1]
        name = reply[offset + 6 : offset + 6 + host_len].decode()
        advertised.add((name, struct.unpack_from(">i", reply, offset + 6 + host_len)[0]))
        offset += 10 + host_len
    return advertised


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed mid-reply")
        data += chunk
    return data

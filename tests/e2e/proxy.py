"""A TCP proxy the tests control: forward to a target, cut every connection on demand.

It can also drop Kafka requests by API key (``drop``): requests are framed
(a 4-byte size, then the API key as the first two bytes of the body), so a
dropped one is never answered while the rest of its connection works, e.g.
every JoinGroup (key 11) so that no group join can complete.

With ``tls`` (a server SSLContext) it terminates TLS in front of a plaintext
broker, as a Kafka listener with ``ssl.client.auth`` would: the local broker
has no TLS of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
import threading

from onceflow.actors.loop import EventLoopThread


class CuttableProxy:
    """Listens on ``port`` and forwards to ``target_port``; ``cut()`` drops all links."""

    def __init__(self, port: int, target_port: int, host: str = "127.0.0.1",
                 tls: ssl.SSLContext | None = None):
        self._io = EventLoopThread("test-proxy")
        self._host, self._target = host, target_port
        self._writers: set[asyncio.StreamWriter] = set()
        self._lock = threading.Lock()
        self.cuts = 0
        self.drop: frozenset[int] = frozenset()  # Kafka API keys never forwarded
        self.dropped = 0
        self.refusing = False  # new connections are closed at once (the broker "is down")
        self.peers: list[str] = []  # with ``tls``: each client certificate's subject CN
        self._server = self._io.run(asyncio.start_server(self._link, host, port, ssl=tls))

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        peer = writer.get_extra_info("peercert")
        if peer:
            self.peers.append(dict(pair[0] for pair in peer["subject"])["commonName"])
        try:
            up_reader, up_writer = await asyncio.open_connection(self._host, self._target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._requests(reader, up_writer), self._pipe(up_reader, writer))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client to broker, one request at a time; those with a key in ``drop`` vanish."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", size)[0])
                if struct.unpack(">h", body[:2])[0] in self.drop:
                    self.dropped += 1
                    continue
                writer.write(size + body)
                await writer.drain()
        writer.close()
        self._writers.discard(writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()
        self._writers.discard(writer)

    def cut(self) -> int:
        """Close every open connection (both sides); returns how many were cut."""

        async def close_all() -> int:
            writers = list(self._writers)
            for w in writers:
                w.transport.abort()
            self._writers.clear()
            return len(writers)

        self.cuts += 1
        return self._io.run(close_all())

    def down(self) -> None:
        """Cut every connection and refuse new ones until ``up()``."""
        self.refusing = True
        self.cut()

    def up(self) -> None:
        self.refusing = False

    def close(self) -> None:
        async def stop_listening() -> None:
            # On the loop: a Server is not thread-safe, and the loop closing a connection at
            # that moment (a failed TLS handshake) raced its close (Server._wakeup: 'NoneType'
            # object is not iterable)
            self._server.close()

        try:
            self._io.run(stop_listening())
            self.cut()
        finally:
            self._io.stop()

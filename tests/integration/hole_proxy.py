"""A Kafka proxy that removes chosen record batches from Fetch responses: offset holes
on demand.

Tansu reserves a batch's offsets before it writes the batch, so a fetch that lands in
between returns the later batches without it (an "offset hole"). That race is rare and
depends on load; this proxy makes the same hole where a test says, every run. For one
partition, and each chosen offset in turn, the first Fetch response holding a complete
batch at or after that offset with a complete batch after it (so the client sees later
offsets without the earlier ones) loses that batch, and the batches after the next
one: one hole per response, ending there (as a size limit could end a response). Every
other byte is forwarded as is. ``removed`` lists what went: ``(base offset, records)``.
``MarkerProxy`` instead serves chosen one-record batches as transaction commit markers.

Kafka frames every request and response as an int32 size and a body. A request body
starts with api_key int16, api_version int16, correlation_id int32, client_id string;
a response body with the correlation_id: the proxy remembers each Fetch (key 1)
request's version by correlation id. aiokafka 0.14 speaks Fetch v4 to v11 (none of
them "flexible"), whose response is: throttle_time_ms int32, [v7+ error_code int16,
session_id int32], topics [name string, partitions [partition int32, error_code
int16, high_watermark int64, last_stable_offset int64, (v5+) log_start_offset int64,
aborted_transactions [producer_id int64, first_offset int64], (v11) preferred_read_
replica int32, records bytes]]. The records are record batches, each base_offset int64,
batch_length int32 and batch_length bytes, last_offset_delta int32 at byte 23; the
last one may be cut short by the fetch's size limit (the client drops it).

``max_wait_ms`` limits the holes to fetches with that max wait: the worker's own
group-less readers (the lag reader, the log-mark check) fetch with 100 ms and must not
use up a hole meant for its consumer.

``freeze_metadata(topic)`` makes the broker stop answering metadata about ``topic``: a
link that sends a Metadata (key 3) request naming it from then on holds it, and
everything after it on that link (Kafka answers a connection's requests in order), until
``thaw()``; ``held`` counts the requests held so. Other links, and Metadata requests for
other topics or for all (a worker's other clients: its consumer, its tail and log-mark
readers), keep flowing. A Metadata request body (v0 to v5, as aiokafka sends them) starts
with the topics array: int32 count (-1: all topics), then int16-sized names.

``show_partitions(topic, count)`` makes Metadata responses describe ``topic`` with its
first ``count`` partitions only (None: as the broker does): a topic re-described to its
clients without a broker that can add partitions. The responses are decoded and encoded
again with aiokafka's own classes (Metadata v0 to v5, none "flexible").
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Iterable
from itertools import pairwise

from aiokafka.protocol import metadata
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy as PyBuilder

from onceflow.actors.loop import EventLoopThread

FETCH = 1
METADATA = 3
VERSIONS = range(4, 12)  # the Fetch versions parsed here: aiokafka 0.14's


def _batches(records: bytes) -> list[tuple[int, int, int, int]]:
    """The complete batches of a records field: (start, end, base offset, records)."""
    found, at = [], 0
    while at + 27 <= len(records):
        base, length = struct.unpack_from(">qi", records, at)
        end = at + 12 + length
        if end > len(records):
            break  # cut short by the fetch's size limit
        found.append((at, end, base, struct.unpack_from(">i", records, at + 23)[0] + 1))
        at = end
    return found


class HoleProxy:
    """Listens on ``port``, forwards to ``target_port``; punches holes in ``topic``'s
    ``partition`` at ``offsets`` (see the module doc)."""

    def __init__(self, port: int, target_port: int, topic: str, partition: int,
                 offsets: Iterable[int], max_wait_ms: int | None = None,
                 host: str = "127.0.0.1"):
        self._io = EventLoopThread("hole-proxy")
        self._host, self._target, self.port = host, target_port, port
        self._topic, self._partition = topic.encode(), partition
        self._max_wait = max_wait_ms
        self.pending = sorted(offsets)  # offsets still to punch a hole at
        self.removed: list[tuple[int, int]] = []  # (base offset, records) of each batch
        self.versions: set[int] = set()  # Fetch versions seen
        self.errors: list[str] = []  # responses that could not be parsed (forwarded as is)
        self._writers: set[asyncio.StreamWriter] = set()
        self.held = 0  # Metadata requests held while frozen
        self._frozen: bytes | None = None  # the topic whose Metadata requests are held
        self._shown: dict[bytes, int] = {}  # topic -> partitions Metadata answers show
        self._thawed = self._io.run(self._event())
        self._server = self._io.run(asyncio.start_server(self._link, host, port))

    @staticmethod
    async def _event() -> asyncio.Event:
        thawed = asyncio.Event()  # made on the proxy's loop
        thawed.set()
        return thawed

    def freeze_metadata(self, topic: str) -> None:
        """From now on, hold every Metadata request naming ``topic`` (and its link) until
        ``thaw``."""
        self._frozen = topic.encode()
        self._io.loop.call_soon_threadsafe(self._thawed.clear)

    @staticmethod
    def _named(body: bytes) -> set[bytes]:
        """The topics a Metadata request names (none for "all topics")."""
        (client,) = struct.unpack_from(">h", body, 8)
        at = 10 + max(client, 0)
        (count,), at = struct.unpack_from(">i", body, at), at + 4
        names = set()
        for _ in range(max(count, 0)):
            (size,) = struct.unpack_from(">h", body, at)
            names.add(body[at + 2:at + 2 + size])
            at += 2 + size
        return names

    def thaw(self) -> None:
        self._io.loop.call_soon_threadsafe(self._thawed.set)

    def show_partitions(self, topic: str, count: int | None) -> None:
        """Metadata answers show ``topic``'s first ``count`` partitions (None: all)."""
        def apply() -> None:
            if count is None:
                self._shown.pop(topic.encode(), None)
            else:
                self._shown[topic.encode()] = count
        self._io.loop.call_soon_threadsafe(apply)

    def _described(self, body: bytes, version: int) -> bytes:
        """``body`` (a Metadata response) with the shown topics' other partitions left out."""
        kind = getattr(metadata, f"MetadataResponse_v{version}", None)
        if kind is None:
            raise ValueError(f"Metadata v{version} is not parsed here")
        answer = kind.decode(body[4:])
        topics = []
        for topic in answer.topics:  # error_code, topic, [is_internal], partitions
            shown = self._shown.get(topic[1].encode())
            if shown is not None:
                topic = (*topic[:-1], [p for p in topic[-1] if p[1] < shown])
            topics.append(topic)
        answer.topics = topics
        return body[:4] + answer.encode()

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self._host, self._target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        fetches: dict[int, int] = {}  # correlation id -> Fetch version, on this link
        metas: dict[int, int] = {}  # correlation id -> Metadata version, on this link
        await asyncio.gather(self._requests(reader, up_writer, fetches, metas),
                             self._responses(up_reader, writer, fetches, metas))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        fetches: dict[int, int], metas: dict[int, int]) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", size)[0])
                key, version, correlation = struct.unpack_from(">hhi", body)
                if (key == METADATA and not self._thawed.is_set()
                        and self._frozen in self._named(body)):
                    self.held += 1
                    await self._thawed.wait()
                if key == METADATA:
                    metas[correlation] = version
                if key == FETCH:
                    client = struct.unpack_from(">h", body, 8)[0]
                    max_wait = struct.unpack_from(">i", body, 10 + max(client, 0) + 4)[0]
                    if self._max_wait is None or max_wait == self._max_wait:
                        fetches[correlation] = version
                writer.write(size + body)
                await writer.drain()
        writer.close()

    async def _responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         fetches: dict[int, int], metas: dict[int, int]) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", size)[0])
                correlation = struct.unpack_from(">i", body)[0]
                described = metas.pop(correlation, None)
                if described is not None and self._shown:
                    try:
                        body = self._described(body, described)
                    except (ValueError, struct.error) as error:
                        self.errors.append(f"Metadata v{described}: {error!r}")
                version = fetches.pop(correlation, None)
                if version is not None and self.pending:
                    self.versions.add(version)
                    try:
                        body = self._punch(body, version)
                    except (ValueError, struct.error) as error:
                        self.errors.append(f"Fetch v{version}: {error!r}")
                writer.write(struct.pack(">i", len(body)) + body)
                await writer.drain()
        writer.close()

    def _punch(self, body: bytes, version: int) -> bytes:
        """``body`` (a Fetch response) without the next chosen batch, if it holds it."""
        if version not in VERSIONS:
            raise ValueError(f"Fetch v{version} is not parsed here (only v4-v11)")
        at = 4 + 4 + (6 if version >= 7 else 0)  # correlation id, throttle, error + session
        (topics,), at = struct.unpack_from(">i", body, at), at + 4
        for _ in range(topics):
            (name_size,) = struct.unpack_from(">h", body, at)
            name, at = body[at + 2:at + 2 + name_size], at + 2 + name_size
            (partitions,), at = struct.unpack_from(">i", body, at), at + 4
            for _ in range(partitions):
                (partition,) = struct.unpack_from(">i", body, at)
                at += 4 + 2 + 8 + 8 + (8 if version >= 5 else 0)  # id, error, hw, lso, start
                (aborted,) = struct.unpack_from(">i", body, at)
                at += 4 + 16 * max(aborted, 0) + (4 if version >= 11 else 0)
                (size,) = struct.unpack_from(">i", body, at)
                records = body[at + 4:at + 4 + max(size, 0)]
                if (name, partition) == (self._topic, self._partition):
                    kept = self._cut(records)
                    if kept is not records:
                        return (body[:at] + struct.pack(">i", len(kept)) + kept
                                + body[at + 4 + size:])
                at += 4 + max(size, 0)
        return body

    def _cut(self, records: bytes) -> bytes:
        """``records`` without the first batch at or after the next chosen offset that
        has a complete batch after it, and without the batches after that one (as a
        fetch's size limit could end it): a client that moves on past the hole meets the
        next chosen offset in a later response. ``records`` itself if there is none."""
        batches = _batches(records)
        for (start, end, base, count), (_, after, _, _) in pairwise(batches):
            if base >= self.pending[0]:
                self.pending.pop(0)
                self.removed.append((base, count))
                return records[:start] + records[end:after]
        return records

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()

        try:
            self._io.run(stop())
        finally:
            self._io.stop()


class _ControlBuilder(PyBuilder):
    """aiokafka's batch builder writing a control batch (the bit only a broker sets)."""

    def _get_attributes(self, include_compression_type: bool = True) -> int:
        return int(super()._get_attributes(include_compression_type)) | self.CONTROL_MASK


def commit_marker(base: int, producer_id: int = 9) -> bytes:
    """A transaction's commit marker at ``base``, as Apache Kafka writes one: a control
    batch of one control record (key: version 0, type 1; value: version, epoch)."""
    builder = _ControlBuilder(2, 0, True, producer_id, 0, -1, 1 << 20)
    builder.append(0, int(time.time() * 1000), struct.pack(">hh", 0, 1),
                   struct.pack(">hi", 0, 0), [])
    data = builder.build()
    struct.pack_into(">q", data, 0, base)
    return bytes(data)


class MarkerProxy(HoleProxy):
    """Serves the one-record batch at each of ``offsets`` as a commit marker, in every
    Fetch response that holds it (the log of a partition a transactional producer wrote
    to; Tansu has no transactions). Every other byte is forwarded as is; ``replaced``
    counts the batches served as markers."""

    def __init__(self, port: int, target_port: int, topic: str, partition: int,
                 offsets: Iterable[int], host: str = "127.0.0.1"):
        super().__init__(port, target_port, topic, partition, offsets, None, host)
        self._markers = frozenset(self.pending)
        self.replaced = 0

    def _cut(self, records: bytes) -> bytes:
        parts, last, changed = [], 0, False
        for start, end, base, count in _batches(records):
            if base in self._markers:
                if count != 1:
                    raise ValueError(f"the batch at {base} holds {count} records, not 1")
                parts += [records[last:start], commit_marker(base)]
                last, changed = end, True
                self.replaced += 1
        return b"".join([*parts, records[last:]]) if changed else records

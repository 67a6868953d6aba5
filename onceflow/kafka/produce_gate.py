"""The fence on the produce path: no record of a worker that lost its partitions leaves it.

Kafka cannot refuse a zombie's records as the store refuses its states, so the
producer (``kafka.producer``) checks before records go out (docs/architecture.md,
"Fencing"):

- a send holding exclusive outputs (exclusive republish, dead letters, late events)
  has the epochs of its input partitions checked in the store first (``check``: one
  read per batch, on the pipeline thread);
- right before aiokafka writes a produce request (``install``: its ``client.send``
  wrapped), every held epoch is checked again in the store when the last check is
  over ``RECHECK_AFTER`` old (the records waited, or the process was paused), and
  always, with no store read, every input partition of a send not settled yet must
  still be held here (``sending`` counts them). A revoke whose flush failed (the
  pipeline actor down: a zombie thawed) drops its partitions from the fence while
  their records wait in the lanes; a re-check of the epochs held *then* would pass
  with nothing left to check;
- an outbox row is written only under the same condition (``outbox_guard``).

Found fenced, it counts and logs it and fails the producer's incarnation: the
supervisor restarts it from the store and the outputs' tails.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from onceflow.actors import metrics
from onceflow.actors.base import FatalHandler
from onceflow.actors.messages import Send
from onceflow.kafka.delivery import FencedProduce
from onceflow.stages.state import TopicPartition
from onceflow.stores.fencing import Fenced, Guard
from onceflow.stores.fencing.held_epochs import RECHECK_AFTER, OutputFence

log = logging.getLogger(__name__)

#: Kafka's API key of a produce request (aiokafka's request classes carry it in every version).
PRODUCE_API_KEY = 0


class ProduceGate:
    """One producer's checks against its worker's epochs (``fence``); failures reach
    ``on_fatal`` as the producer ``name``'s."""

    def __init__(self, fence: OutputFence, on_fatal: FatalHandler, name: str):
        self._fence = fence
        self._on_fatal = on_fatal
        self._name = name
        self._checked = 0.0  # loop time of the last passed check in the store
        # the input partitions of the sends not settled yet (one count per send)
        self._unsettled: Counter[TopicPartition] = Counter()

    def check(self, message: Send, started: float) -> None:
        """(the pipeline thread) A batch with exclusive outputs: its inputs' epochs checked
        in the store, ``started`` at that loop time (a check is as old as its start: a
        pause while the answer was on its way must not make it look fresh). Raises
        ``Fenced``, logged and counted."""
        if not self._fence.wanted(message.outputs):
            return
        try:
            self._fence.check(message.depends)
        except Fenced as error:
            self.fenced(error, len(message.outputs))
            raise
        self._checked = max(self._checked, started)

    @contextmanager
    def sending(self, depends: frozenset[TopicPartition]) -> Iterator[None]:
        """(on the loop) A send's records are in the lanes: their input partitions must
        stay held until it is settled."""
        self._unsettled.update(depends)
        try:
            yield
        finally:
            self._unsettled.subtract(depends)
            for tp in depends:
                if self._unsettled[tp] <= 0:
                    del self._unsettled[tp]

    def install(self, client: Any) -> None:
        """Wrap aiokafka's ``client.send``: every produce request passes ``_fresh`` and
        ``_still_held`` first (nothing yields between those and the write once the node
        is ready). Every request: which topics one holds is private to aiokafka, and it
        costs at most a store read a second."""
        send = client.send

        async def gated(node_id: int, request: Any, **kwargs: Any) -> Any:
            if getattr(request, "API_KEY", None) != PRODUCE_API_KEY:
                return await send(node_id, request, **kwargs)
            await self._fresh(client, node_id)  # at most one check a second
            self._still_held()  # nothing yields from here to the write
            loop = asyncio.get_running_loop()
            checked = self._checked
            answer = await send(node_id, request, **kwargs)
            if (late := loop.time() - checked) > RECHECK_AFTER:  # an upper bound of the window
                log.info("a produce request was acknowledged %.1fs after its epochs' last "
                         "check: if a pause fell before it left the process (the fence's "
                         "residual window), a successor may have written its records too",
                         late)
            return answer

        client.send = gated

    def outbox_guard(self, held: Callable[[], Guard]) -> Callable[[], Guard]:
        """The guard of an outbox write (``held``: every epoch held, as outbox rows are not
        traced to inputs), refused as a produce request would be."""
        def guard() -> Guard:
            self._fence.fence.expect(self._unsettled)
            return held()
        return guard

    async def _fresh(self, client: Any, node_id: int) -> None:
        """Until the last check is younger than ``RECHECK_AFTER``: check every held epoch
        again (the node made ready first, so no wait is left before the write)."""
        loop = asyncio.get_running_loop()
        while (waited := (started := loop.time()) - self._checked) > RECHECK_AFTER:
            if not self._checked:  # the first produce request of this producer
                log.debug("epochs checked before the first produce request")
            else:
                log.log(logging.INFO if waited > 3 * RECHECK_AFTER else logging.DEBUG,
                        "epochs last checked %.1fs ago (a pause, or records that waited): "
                        "checked again before the produce request", waited)
            try:
                await asyncio.to_thread(self._fence.recheck, self._fence.fence.held())
            except Fenced as error:
                self._refuse(error)
            self._checked = max(self._checked, started)  # as old as its start (see check)
            await client.ready(node_id)

    def _still_held(self) -> None:
        """Every input partition of an unsettled send is still held here (no store read);
        a partition taken again after another member held it is kept back until forgotten,
        so it refuses too."""
        try:
            self._fence.fence.expect(self._unsettled)
        except Fenced as error:
            self._refuse(error)

    def _refuse(self, error: Fenced) -> None:
        self.fenced(error, None)
        self._on_fatal(self._name, error)
        raise FencedProduce(str(error)) from error

    def fenced(self, error: Fenced, dropped: int | None) -> None:
        metrics.FENCED.inc()
        log.error("%s; outputs not produced (%s): the pipeline restarts from "
                  "what is durable and the outputs' tails", error,
                  "a produce request and the records in its lanes dropped" if dropped is None else
                  f"a batch of {dropped} records and those waiting in the lanes dropped")

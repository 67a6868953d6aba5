"""One reconciliation: read the input to the committed offsets (or to a time,
``reconcile.cut``), replay it, compare.

``reconcile`` returns a ``Result``: every entry that is not equal, the count of
each verdict per stage, the offsets it reconciled up to, and how the replay
accounted for the records (``Replay.counters``, the worker's stat names).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.reconcile.compare import DIFFERENT, UNDECIDED, Entry, compare_stage
from onceflow.reconcile.cut import stopping_offsets
from onceflow.reconcile.expiry import aged, lifetimes, restart_rule
from onceflow.reconcile.order import Order, logged_order, ordered_inputs, read_merge_log
from onceflow.reconcile.replay import Replay
from onceflow.reconcile.source import Horizon, horizon, records_until
from onceflow.runtime.config import ConfigError
from onceflow.runtime.settings import Settings
from onceflow.stages.pipeline import Aggregate, Pipeline
from onceflow.stages.state import TopicPartition, decode_state
from onceflow.stores.base import StateStore

__all__ = ["EXIT_DRIFT", "EXIT_EQUAL", "EXIT_UNDECIDED", "Result", "reconcile"]

EXIT_EQUAL, EXIT_DRIFT, EXIT_UNDECIDED = 0, 1, 2
#: Called with (records read so far, records to read) as the input is replayed.
Progress = Callable[[int, int], None]


@dataclass
class Result:
    pipeline: str
    group: str
    horizon: Horizon
    heads: dict[tuple[str, int], int] = field(default_factory=dict)  # first retained offsets
    read: int = 0  # input records read and replayed
    counts: dict[str, Counter[str]] = field(default_factory=dict)  # stage -> verdict -> n
    entries: list[Entry] = field(default_factory=list)  # every entry not equal
    counters: dict[str, int] = field(default_factory=dict)  # the replay's stats
    sent: dict[str, int] = field(default_factory=dict)  # records the replay produced, per topic
    seconds: float = 0.0
    problem: str | None = None  # why it could not decide at all
    unordered: list[str] = field(default_factory=list)  # input the merge log does not order
    until: dict[tuple[str, int], int] = field(default_factory=dict)  # where the replay stops
    cut_at: int | None = None  # --from-offsets committed-at: the time (ms), None: commits

    @property
    def exit_code(self) -> int:
        if any(e.verdict in DIFFERENT for e in self.entries):
            return EXIT_DRIFT
        if self.problem or any(e.verdict in UNDECIDED for e in self.entries):
            return EXIT_UNDECIDED
        return EXIT_EQUAL

    @property
    def not_retained(self) -> list[tuple[str, int]]:
        """Input partitions whose first offsets are no longer in the log."""
        return sorted(tp for tp, head in self.heads.items() if head > 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "group": self.group, "exit_code": self.exit_code,
            "problem": self.problem, "cut_at_ms": self.cut_at,
            "seconds": round(self.seconds, 3), "records_read": self.read,
            "offsets": [{"topic": t, "partition": p, "first_retained": self.heads.get((t, p)),
                         "committed": n, "replayed_to": self.until.get((t, p), n),
                         "high_watermark": self.horizon.ends.get((t, p))}
                        for (t, p), n in sorted(self.horizon.committed.items())],
            "stages": {stage: dict(counts) for stage, counts in self.counts.items()},
            "accounting": self.counters, "produced": self.sent, "unordered": self.unordered,
            "entries": [e.as_dict() for e in self.entries],
        }


def reconcile(settings: Settings, pipeline: Pipeline, stages: Sequence[str] = (),
              keys: Sequence[str] = (), progress: Progress | None = None,
              stall: float = 60.0, cut_at: int | None = None) -> Result:
    """Reconcile ``stages`` (default: every aggregate) of ``pipeline`` for ``keys`` (all);
    ``cut_at``: only the input written up to that time (ms; ``reconcile.cut``)."""
    from onceflow.runtime.wiring import consumer_options, open_store

    specs = _selected(settings, pipeline, stages)
    started = time.monotonic()
    options = consumer_options(settings)
    group = settings.kafka.group_id
    timeout = max(10.0, settings.kafka.request_timeout)
    seen = horizon(options, group, pipeline.consumed_topics, timeout)
    result = Result(pipeline.id, group, seen)
    if seen.missing:
        result.problem = f"input topics missing: {', '.join(seen.missing)}"
        return result
    result.cut_at, result.until = cut_at, dict(seen.committed)
    try:
        if cut_at is not None:
            result.until = asyncio.run(stopping_offsets(options, seen.committed, cut_at,
                                                        timeout))
    except Exception as error:  # the input not readable: nowhere to stop
        result.problem = f"cannot read the input: {type(error).__name__}: {error}"
        return result
    try:
        order = _order(settings, pipeline, options, result.until, timeout)
    except Exception as error:  # the log not readable: the worker's order unknown
        result.problem = f"cannot read the merge log: {type(error).__name__}: {error}"
        return result
    stores: dict[str, StateStore] = {}
    try:
        for spec in pipeline.aggregates:
            if spec.store not in stores:
                stores[spec.store] = open_store(settings, spec.store, pipeline.id)

        def homes(spec: Aggregate, keys: Sequence[str]) -> dict[str, TopicPartition]:
            found = stores[spec.store].load(spec.id, list(keys)).items()
            return {key: home for key, data in found
                    if (home := _home(data)) is not None}

        timed = any(lifetimes(settings, spec).states or lifetimes(settings, spec).history
                    for spec in specs)  # the expiry rules need the records' timestamps
        replay = Replay(pipeline, settings, None if settings.single_worker else homes, order,
                        timed)
        total = sum(result.until.values())
        try:
            result.read = asyncio.run(_replay(replay, options, result.until, result.heads,
                                              progress, total, stall))
        except Exception as error:  # any failure to read the input: cannot decide
            result.problem = f"cannot read the input: {type(error).__name__}: {error}"
            return result
        result.counters, result.sent = dict(replay.counters), dict(replay.sent)
        retained, lost = not result.not_retained, set(result.not_retained)
        cut = result.until != seen.committed
        if order is not None:
            result.unordered = order.gaps + [
                f"{run.topic}/{run.partition} offsets {run.first}..{run.last} logged, not read"
                for run in getattr(replay.runner, "unreplayed", ())]
        inputs = set(seen.committed)
        for spec in specs:
            store = stores[spec.store]
            history = store.scan_history(spec.id) if spec.window is not None else iter(())
            tally = result.counts.setdefault(spec.id, Counter())
            mine = replay.recomputed(spec.id)
            closed = {(key, start): ms for (stage, key, start), ms
                      in replay.closed_after.items() if stage == spec.id}
            life = lifetimes(settings, spec)
            rule = aged(life, mine, replay.timestamp, closed)
            restarted = {key: restart_rule(life.states, *gap)
                         for (stage, key), gap in replay.gaps.items() if stage == spec.id}
            for entry in compare_stage(spec, store.scan(spec.id), history, mine,
                                       replay.history(spec.id), inputs, set(keys), retained,
                                       not result.unordered, rule, lost, cut, restarted):
                tally[entry.verdict] += 1
                if entry.verdict != "equal":
                    result.entries.append(entry)
    finally:
        for store in stores.values():
            store.close()
    if not retained:
        heads = ", ".join(f"{t}/{p} from {result.heads[(t, p)]}" for t, p in result.not_retained)
        result.problem = f"input no longer retained from offset 0: {heads}"
    elif any(e.verdict == "order unknown" for e in result.entries):
        result.problem = ("the merge log does not give the order the worker applied: "
                          + "; ".join(result.unordered[:5]))
    result.seconds = time.monotonic() - started
    return result


def _order(settings: Settings, pipeline: Pipeline, options: dict[str, Any],
           until: dict[tuple[str, int], int], timeout: float) -> Order | None:
    """The worker's merge log below where the replay stops (None: it keeps none)."""
    shape = ordered_inputs(pipeline, settings.single_worker, until)
    if shape is None:
        return None
    topics, across = shape
    logged = asyncio.run(read_merge_log(options, pipeline.id, timeout))
    return logged_order(logged, topics, across, until)


def _home(data: bytes) -> TopicPartition | None:
    try:
        return decode_state(data).home
    except ValueError:  # compared (and named) later; no home to follow
        return None


async def _replay(replay: Replay, options: dict[str, Any], until: dict[tuple[str, int], int],
                  heads: dict[tuple[str, int], int], progress: Progress | None, total: int,
                  stall: float) -> int:
    read = 0
    async for chunk in records_until(options, until, heads, stall):
        replay.feed(chunk)
        replay.persist()  # the changed states move to the replay's store: nothing else grows
        read += len(chunk)
        if progress is not None:
            progress(read, total)
    return read


def _selected(settings: Settings, pipeline: Pipeline, stages: Sequence[str]
              ) -> list[Aggregate]:
    specs = {spec.id: spec for spec in pipeline.aggregates}
    unknown = [stage for stage in stages if stage not in specs]
    if unknown or not specs:
        names = ", ".join(specs) or "none"
        raise ConfigError(settings.source, "onceflow.pipeline",
                          f"pipeline {pipeline.id!r} has no aggregate "
                          f"{', '.join(map(repr, unknown)) or 'at all'} (it has {names})")
    return [specs[stage] for stage in stages] if stages else list(specs.values())

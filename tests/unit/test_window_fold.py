"""The engine's paths for windowed segments, fused (``stages.window_fold``) and general
(``stages.general_path``), against the reference model (``fold_model``), on the same
batches: same states, watermarks, open-window index, history rows, counters, outputs,
late events and dead letters.

Hypothesis draws batches of envelopes over two input partitions, carrying
values of two root partitions, as units (several items) or as one payload
that a flat-map fans out, into a minute stage feeding a day stage. The draws
hold replays of earlier offsets, values late for their window, watermarks
that rise (windows closing, idle roots, a held first start), folds and event
times that raise, folds whose value no store can hold (in either stage: the first
stage folded when the second fails), keys that are not strings and keys fed from both
input partitions (homed elsewhere). Between batches, snapshots write states and rows and let
the cache evict, and crashes restart both runners from their stores and
replay what was not snapshotted, its late events found written before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import pytest
from fold_model import ModelPath
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runner import Rec

from onceflow.examples.robot_chain import build_windows
from onceflow.protos.envelope_pb2 import Envelope, SourceRef
from onceflow.stages import Pipeline, Tumbling
from onceflow.stages.outcome import BatchOutcome
from onceflow.stages.pipeline import Aggregate
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.side_outputs import LateFound, late_value
from onceflow.stages.state import AggregateState, TopicPartition, decode_state
from onceflow.stages.watermark import WINDOWS_STAGE
from onceflow.stages.window_fold import WindowSegment

LATE, DEAD = "late", "dead"


def refusing(refused: int, unstorable: int) -> Any:
    def fold(total: int, value: dict[str, int]) -> Any:
        if value["x"] == refused:
            raise ValueError(f"{refused} is refused")
        if value["x"] == unstorable:
            return {total}  # a set: no store can hold it (guards.check_state)
        return total + value["x"]
    return fold


def timed(broken: int) -> Any:
    return lambda value: None if value["x"] == broken else value["t"]


def pipeline() -> Pipeline:
    return (
        Pipeline("p", topics=("norm",))
        .map("parse", json.loads)
        .flat_map("explode", lambda doc: doc.get("xs", [doc]))
        .aggregate("minute", key=lambda v: 11 if v["x"] == 11 else v["k"], init=int,
                   fold=refusing(7, 17), window=Tumbling(10, timed(13), allowed_lateness_ms=5))
        .aggregate("day", key=lambda v: v["k"] + "d", init=int, fold=refusing(9, 19),
                   window=Tumbling(50, timed(12)))
    )


class Stored:
    """Written states, rows, history and homes, standing in for a store."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}
        self.history: dict[tuple[str, str, int], Any] = {}
        self.homes: dict[str, TopicPartition] = {}
        self.snapshots = 0

    def load(self, spec: Aggregate, keys: Sequence[str]) -> dict[str, AggregateState]:
        return {k: decode_state(self.rows[spec.id, k]) for k in keys if (spec.id, k) in self.rows}

    def load_rows(self, store: str, keys: Iterable[str]) -> dict[str, bytes]:
        return {k: self.rows[WINDOWS_STAGE, k] for k in keys if (WINDOWS_STAGE, k) in self.rows}

    def claim(self, spec: Aggregate, feeders: Mapping[str, TopicPartition]
              ) -> Mapping[str, TopicPartition]:
        for key, fed in feeders.items():
            self.homes.setdefault(f"{spec.id}:{key}", fed)
        return {key: self.homes[f"{spec.id}:{key}"] for key in feeders}

    def snapshot(self, run: PipelineRunner) -> None:
        """Persist as the worker does: index rows, states and history, watermark rows."""
        self.snapshots += 1
        for clock in run.clocks.values():
            self.rows.update(((WINDOWS_STAGE, k), r) for k, r in clock.rows_before_states().items())
        for table in run.tables:
            self.history.update(((table.spec.id, key, start), value)
                                for (key, start), value in table.take_closed().items())
            self.rows.update(((table.spec.id, k), data)
                             for k, data in table.take_dirty(self.snapshots).items())
            table.written(self.snapshots)
            table.evict()
        for clock in run.clocks.values():
            self.rows.update(((WINDOWS_STAGE, k), r) for k, r in clock.rows_after_states().items())


def runner(path: str | bool, stored: Stored, hold_new: bool) -> PipelineRunner:
    """``fused`` (or True): the engine as it runs; ``general`` (or False): the engine
    without its fused paths; ``model``: the reference model in place of the general path,
    nothing fused."""
    made = PipelineRunner(pipeline(), stored.load, DEAD, LATE, claim=stored.claim, max_states=2,
                          load_rows=stored.load_rows, idle_timeout=0.04, hold_new=hold_new)
    made.assigned([("norm", 0), ("norm", 1)])
    if path not in ("fused", True):
        made._fused = {}
    if path == "model":
        made._general = ModelPath(made.clocks, made.side, True, LATE, made._max_value,
                                  made.pipeline.id)
    return made


PATHS = ("model", "fused", "general")  # the model first: the others are compared with it


#: (lag behind the stream's event time, x): x 7, 9 a fold refuses, 17, 19 it makes a state no
#: store can hold of, 12, 13 has no event time, 11 has a key that is no string.
items = st.lists(st.tuples(st.integers(0, 90), st.integers(0, 30)), min_size=1, max_size=3)
#: (stray: fed from the key's other partition, root, key, items, unit, replay: 4 of 5)
records = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 1), st.sampled_from("abc"), items,
                             st.booleans(), st.integers(0, 4)), min_size=1, max_size=8)
#: After a batch: 0 nothing, 1 a snapshot, 2 a crash (restart from the stores, replay).
afters = st.integers(0, 2)


class Stream:
    """Envelopes per input partition; a root partition's offsets run on across both."""

    def __init__(self) -> None:
        self.offsets = [0, 0]
        self.roots = [0, 0]
        self.clock = 0
        self.sent: list[list[Rec]] = [[], []]

    def batch(self, draw: list[tuple[int, int, str, list[tuple[int, int]], bool, int]]
              ) -> list[Rec]:
        self.clock += 15  # event time moves on; items lag it by up to 90 ms
        out = []
        for stray, root, key, values, unit, replay in draw:
            partition = int((key == "b") ^ (stray == 9))  # the key's home, or the other one
            sent = self.sent[partition]
            if replay == 4 and sent:  # a re-delivery of an earlier offset
                out.append(sent[len(out) % len(sent)])
                continue
            docs = [{"k": key, "t": max(0, self.clock - lag), "x": x} for lag, x in values]
            env = Envelope()
            env.source_chain.append(SourceRef(topic="raw", partition=root,
                                              offset=self.roots[root], index=0))
            self.roots[root] += 1
            if unit:
                for index, doc in enumerate(docs):
                    env.items.add(index=index, payload=json.dumps(doc).encode(),
                                  event_time_ms=doc["t"])
            else:
                env.payload = json.dumps({"xs": docs}).encode()
            rec = Rec("norm", partition, self.offsets[partition], env.SerializeToString(),
                      key.encode())
            self.offsets[partition] += 1
            sent.append(rec)
            out.append(rec)
        return out


def late_found(outputs: Iterable[BatchOutcome]) -> LateFound:
    """The late events written by batches since the last snapshot, as the scan finds them."""
    found: LateFound = {}
    for outcome in outputs:
        for out in outcome.outputs:
            mark = late_value(out.headers) if out.topic == LATE else None
            if mark is None:
                continue
            source = dict(out.headers)["onceflow.source"].decode()
            topic, partition, offset = source.rsplit("/", 2)
            (found.setdefault((topic, int(partition)), {})
             .setdefault(int(offset), {})[mark[0]]) = mark[1]
    return found


def seen(run: PipelineRunner, stored: Stored) -> dict[str, Any]:
    """Everything either path may change, in memory and in the store."""
    tables = {t.spec.id: {k: (s.value, s.watermarks, s.home) for k, s in t.states.items()}
              for t in run.tables}
    clocks = {t.spec.id: ({tp: (m.encode(), m.value) for tp, m in c.watermark.partitions.items()},
                          sorted(c.watermark.dirty), dict(c.open.keys))
              for t, c in run.clocks.items()}
    pending = {t.spec.id: (sorted(t.dirty), dict(t.closed)) for t in run.tables}
    return {"tables": tables, "clocks": clocks, "pending": pending, "rows": stored.rows,
            "history": stored.history, "homes": stored.homes}


def same(a: BatchOutcome, b: BatchOutcome) -> None:
    for field in fields(BatchOutcome):  # outputs, dead letters, every counter
        assert getattr(a, field.name) == getattr(b, field.name), field.name


def step(runs: list[PipelineRunner], batch: list[Rec]) -> BatchOutcome:
    first, *others = (run.process(batch) for run in runs)
    for other in others:
        same(other, first)
    return first


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(records, afters), min_size=1, max_size=8), st.booleans())
def test_both_paths_do_what_the_model_does(
        draws: list[tuple[Any, int]], hold_new: bool) -> None:
    stores = [Stored() for _ in PATHS]
    runs = [runner(path, store, hold_new) for path, store in zip(PATHS, stores, strict=True)]
    assert isinstance(runs[1]._fused["norm"], WindowSegment) and not runs[2]._fused
    stream = Stream()
    pending: list[list[Rec]] = []  # the batches since the last snapshot (not committed)
    written: list[BatchOutcome] = []  # what processing them wrote
    for draw, after in draws:
        batch = stream.batch(draw)
        pending.append(batch)
        written.append(step(runs, batch))
        if after == 1:
            for store, run in zip(stores, runs, strict=True):
                store.snapshot(run)
            pending, written = [], []
        elif after == 2:  # a crash: restart from the stores, replay what was not snapshotted
            found = late_found(written)
            runs = [runner(path, store, hold_new)
                    for path, store in zip(PATHS, stores, strict=True)]
            for run in runs:
                run.side.late.resume(found, [("norm", 0), ("norm", 1)])
            written.extend(step(runs, batch) for batch in pending)
        for run, store in zip(runs[1:], stores[1:], strict=True):
            assert seen(run, store) == seen(runs[0], stores[0])


def test_the_chain_example_and_only_its_shape_run_fused() -> None:
    """The windowed aggregator of the chain example takes the fused path; a segment with a
    republish step or an aggregate without windows keeps the general one."""
    example = PipelineRunner(build_windows("normalized", "redis"), Stored().load, DEAD)
    assert isinstance(example._fused["normalized"], WindowSegment)
    windowed = Tumbling(10, lambda v: v)
    other_shapes = [
        Pipeline("p", topics=("in",)).aggregate("a", key=str, init=int, fold=max, window=windowed)
        .republish("out", "out"),
        Pipeline("p", topics=("in",)).aggregate("a", key=str, init=int, fold=max, window=windowed)
        .aggregate("b", key=str, init=int, fold=max),
        Pipeline("p", topics=("in",)).aggregate("a", key=str, init=int, fold=max, window=windowed)
        .map("m", str).aggregate("b", key=str, init=int, fold=max, window=windowed),
    ]
    for shape in other_shapes:
        assert "in" not in PipelineRunner(shape, Stored().load, DEAD)._fused


def test_a_new_keys_record_is_folded_fused_once_its_state_is_loaded() -> None:
    """The first record of a key is planned and held back while its state loads, then folded
    on the fused path, as the next one is."""
    stores = Stored(), Stored()
    runs = [runner(True, stores[0], False), runner(False, stores[1], False)]
    fused = runs[0]._fused["norm"]
    assert isinstance(fused, WindowSegment)
    folded: list[int] = []  # folds by the fused path (the general one calls the spec's fold)
    minute = fused.stages[0]
    fold = minute.fold
    minute.fold = lambda state, value: (folded.append(1), fold(state, value))[1]
    stream = Stream()
    step(runs, stream.batch([(0, 0, "a", [(0, 1), (0, 2)], True, 0)]))
    assert folded == [1, 1]
    step(runs, stream.batch([(0, 0, "a", [(0, 3)], False, 0)]))
    assert folded == [1, 1, 1]
    assert seen(runs[0], stores[0]) == seen(runs[1], stores[1])


@pytest.mark.parametrize("row", [
    b'{"v":5,"w":[]}',  # not a windowed state
    b'{"v":{"open":{},"max_ts":1e12},"w":[]}',  # closed to a time that is no int
])
def test_a_damaged_state_dead_letters_the_record_on_both_paths(row: bytes) -> None:
    """A corrupt stored state, one no onceflow step wrote, fails its records as a fold does
    (the same reason on either path, and the model's), instead of failing the batch."""
    stores = [Stored() for _ in PATHS]
    for store in stores:
        store.rows["minute", "a"] = row
    runs = [runner(path, store, False) for path, store in zip(PATHS, stores, strict=True)]
    stream = Stream()
    for _ in range(2):  # the first loads the state (general path), the second finds it cached
        outcome = step(runs, stream.batch([(0, 0, "a", [(0, 1)], False, 0)]))
        assert outcome.dead_letters == 1 and outcome.rejected == {("minute", "TypeError"): 1}
    for run, store in zip(runs[1:], stores[1:], strict=True):
        assert seen(run, store) == seen(runs[0], stores[0])

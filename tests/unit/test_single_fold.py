"""The engine's paths for the commonest segment, fused (``stages.single_fold``) and general
(``stages.general_path``), against the reference model (``fold_model``), on the same
batches: same states, watermarks, counters and outputs.

Hypothesis draws batches over two partitions with replays of earlier offsets,
values a fold refuses or makes a state of that no store can hold, keys that are not
strings and keys fed from both partitions (homed elsewhere, so dead-lettered), and
snapshots between batches that let the cache evict and reload states.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from fold_model import ModelPath
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runner import Rec

from onceflow.stages import Pipeline
from onceflow.stages.pipeline import Aggregate
from onceflow.stages.runner import PipelineRunner
from onceflow.stages.state import AggregateState, TopicPartition, decode_state


def refusing_fold(total: int, value: tuple[str, int]) -> Any:
    if value[1] == 7:
        raise ValueError("seven is refused")
    if value[1] == 5:
        return Decimal(total + 5)  # a state no store can hold (guards.check_state)
    return total + value[1]


def key_of(value: tuple[str, int]) -> Any:
    return 11 if value[1] == 11 else value[0]  # 11: a key no store can hold


def pipeline() -> Pipeline:
    return (
        Pipeline("p", topics=("in",), format="json")
        .map("unwrap", lambda doc: doc)
        .flat_map("explode", lambda doc: [(f"{doc['k']}{x % 2}", x) for x in doc["xs"]])
        .filter("not-13", lambda kv: kv[1] != 13)
        .aggregate("sum", key=key_of, init=int, fold=refusing_fold, store="redis")
    )


class Stored:
    """Written states and homes, standing in for a store."""

    def __init__(self) -> None:
        self.rows: dict[str, bytes] = {}
        self.homes: dict[str, TopicPartition] = {}

    def load(self, spec: Aggregate, keys: Sequence[str]) -> dict[str, AggregateState]:
        return {k: decode_state(self.rows[k]) for k in keys if k in self.rows}

    def claim(self, spec: Aggregate, feeders: Mapping[str, TopicPartition]
              ) -> Mapping[str, TopicPartition]:
        for key, fed in feeders.items():
            self.homes.setdefault(key, fed)
        return {key: self.homes[key] for key in feeders}


def runner(path: str, stored: Stored) -> PipelineRunner:
    """``fused``: the engine as it runs; ``general``: the engine without its fused paths;
    ``model``: the reference model in place of the general path, nothing fused."""
    made = PipelineRunner(pipeline(), stored.load, "dead", claim=stored.claim, max_states=3)
    if path != "fused":
        made._fused = {}
    if path == "model":
        made._general = ModelPath(made.clocks, made.side, True, "onceflow-late-events",
                                  made._max_value, made.pipeline.id)
    return made


values = st.lists(st.integers(0, 15), max_size=4)
records = st.lists(st.tuples(st.integers(0, 1), st.sampled_from("abc"), values,
                             st.booleans()), min_size=1, max_size=12)


def batches_of(draws: list[list[tuple[int, str, list[int], bool]]]) -> list[list[Rec]]:
    """Offsets run on per partition; a ``replay`` record re-delivers an earlier offset."""
    offsets = [0, 0]
    seen: list[list[Rec]] = [[], []]
    out = []
    for draw in draws:
        batch = []
        for partition, key, xs, replay in draw:
            if replay and seen[partition]:
                batch.append(seen[partition][len(batch) % len(seen[partition])])
                continue
            doc = {"k": key, "xs": xs}
            rec = Rec("in", partition, offsets[partition], json.dumps(doc).encode())
            offsets[partition] += 1
            seen[partition].append(rec)
            batch.append(rec)
        out.append(batch)
    return out


def snapshot(run: PipelineRunner, stored: Stored, n: int) -> dict[str, Any]:
    table = run.tables[0]
    stored.rows.update(table.take_dirty(n))
    table.written(n)
    table.evict()
    return {k: stored.rows[k] for k in sorted(stored.rows)}


@settings(max_examples=200, deadline=None)
@given(st.lists(records, min_size=1, max_size=5))
def test_both_paths_do_what_the_model_does(draws: list[Any]) -> None:
    paths = ("model", "fused", "general")
    stores = {path: Stored() for path in paths}
    runs = {path: runner(path, stores[path]) for path in paths}
    assert runs["fused"]._fused and not runs["general"]._fused
    for n, batch in enumerate(batches_of(draws), 1):
        model = runs["model"].process(batch)
        expected = snapshot(runs["model"], stores["model"], n)
        for path in ("fused", "general"):
            got = runs[path].process(batch)
            assert got.outputs == model.outputs, path
            for counter in ("folded", "duplicates", "misaligned", "rejected", "next_offsets"):
                assert getattr(got, counter) == getattr(model, counter), (path, counter)
            assert got.dead_letters == model.dead_letters, path
            assert snapshot(runs[path], stores[path], n) == expected, path

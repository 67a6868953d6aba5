"""``onceflow forget --topic T``: let a re-created root topic's events be counted.

A topic deleted and re-created under its name restarts its offsets at 0,
below the watermarks its old records left; the worker refuses it on
assignment (``onceflow.checkpoint.log_marks``). When the operator knows the new
topic's events are new, this drops from every store of the pipeline what
the old log left behind, and nothing else:

- in every aggregate state, the watermark of each route whose root is ``T``
  (the folded values stay: the old events are counted, the new ones will be);
- in the windows' partition watermarks, ``T``'s roots (a partition watermark
  left with no root starts over);
- the producer-dedup table of each partition of ``T`` (its duplicate count stays);
- the log mark of each partition of ``T`` (for a pipeline without a store, in its
  marks topic: ``kafka.log_marks_topic``, ``NO_MARK`` appended for each), and the
  partition's generation counted up beside it (``log_marks.forgotten_rows``): the new
  log's records are republished with roots above the old log's
  (``lineage.root_offset``), so pipelines downstream need no forget of their own;
- in a join's table fed by ``T``, each row (its versions are the old log's offsets: the
  row is empty until the new topic's records fill it), and ``T``'s runs in the merge
  log (a forget record appended to each of its partitions: ``kafka.merge_log_topic``),
  which a replay would otherwise wait on below ``T``'s new offsets for ever.

Run it with every worker of the pipeline stopped: a worker still running
could write its old view back. The writes take a new epoch for ``T``'s
partitions first (``onceflow.stores.fencing``), so a worker that was left
running is fenced for them, and Cassandra orders these writes after every
earlier one. Logged at WARNING, one line per store stage changed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from onceflow.actors.messages import StageRows
from onceflow.checkpoint.log_marks import NO_MARK, downstream_note, forgotten_rows
from onceflow.checkpoint.persistence import split_states
from onceflow.runtime.config import ConfigError, Settings, load_settings, split_assignment
from onceflow.stages.declarations import LOGS_STAGE
from onceflow.stages.lineage import Route
from onceflow.stages.pipeline import Pipeline
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, PartitionSequences
from onceflow.stages.state import AggregateState, decode_state, encode_state
from onceflow.stages.state_table import has_open_window
from onceflow.stages.watermark import WINDOWS_STAGE
from onceflow.stores.base import StateRows, StateStore
from onceflow.stores.fencing.held_epochs import epoch_source, share_epochs

log = logging.getLogger(__name__)


@dataclass
class Forgotten:
    """What ``forget_topic`` changed: rows per (store, stage), watermarks dropped."""

    topic: str
    rows: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)
    watermarks: int = 0
    partitions: set[int] = field(default_factory=set)
    merge_log_partitions: int = 0  # the merge log's partitions told to drop its runs
    epoch: int | None = None  # the epoch taken for the writes (None: none taken)

    def add(self, store: str, stage: str, key: str, row: bytes) -> None:
        self.rows.setdefault((store, stage), {})[key] = row

    def add_marks(self, store: str, rows: Mapping[str, bytes]) -> None:
        """The log mark rows written (``log_marks.forgotten_rows``): each emptied mark names
        a partition of the topic."""
        for key, row in rows.items():
            if row == NO_MARK:
                self.partitions.add(int(key.rpartition("|")[2]))
            self.add(store, LOGS_STAGE, key, row)


def root_topic(route: Route) -> str:
    """The root topic of a watermark's route (``lineage.route_of``)."""
    return route[0].split("/", 1)[0]


def root_partition(route: Route) -> int:
    name, partition = route
    if "/" not in name:
        return partition
    return int(name.split("/", 1)[1].split(">", 1)[0])


def plan(stores: Mapping[str, StateRows], pipeline: Pipeline, topic: str) -> Forgotten:
    """Read every row ``topic``'s old log left, and what each must become."""
    out = Forgotten(topic)
    for spec in pipeline.aggregates:
        for key, data in stores[spec.store].scan(spec.id):
            state = decode_state(data)
            if _drop_routes(state, topic, out):
                out.add(spec.store, spec.id, key, encode_state(state))
    for join, _ in pipeline.joins:  # a table's rows: their versions came from its old log
        for key, data in stores[join.table.store].scan(join.id):
            state = decode_state(data)
            if _drop_routes(state, topic, out):
                state.value = []
                out.add(join.table.store, join.id, key, encode_state(state))
    for name in dict.fromkeys(spec.store for spec in pipeline.aggregates):
        for key, data in stores[name].scan(WINDOWS_STAGE):
            if "|wm|" in key:
                changed = _windows_row(data, topic, out)
                if changed is not None:
                    out.add(name, WINDOWS_STAGE, key, changed)
    if pipeline.dedup_store is not None:
        for key, data in stores[pipeline.dedup_store].scan(SEQUENCE_STAGE):
            name, _, partition = key.rpartition("|")
            old = PartitionSequences.decode(data)
            if name == topic and (old.next_offset or old.producers):
                out.partitions.add(int(partition))
                out.add(pipeline.dedup_store, SEQUENCE_STAGE, key,
                        PartitionSequences(duplicates=old.duplicates).encode())
    first = next(iter(stores), None)
    if first is not None:
        out.add_marks(first, forgotten_rows(dict(stores[first].scan(LOGS_STAGE)), topic))
    return out


def _drop_routes(state: AggregateState, topic: str, out: Forgotten) -> bool:
    """Drop the watermarks of ``state`` whose root is ``topic``; whether there were any."""
    gone = [route for route in state.watermarks if root_topic(route) == topic]
    for route in gone:
        out.partitions.add(root_partition(route))
        del state.watermarks[route]
    out.watermarks += len(gone)
    return bool(gone)


def _windows_row(data: bytes, topic: str, out: Forgotten) -> bytes | None:
    """A windowed stage's partition watermark without ``topic``'s roots (None: unchanged)."""
    doc = json.loads(data)
    kept = [root for root in doc["r"] if root[0] != topic]
    if len(kept) == len(doc["r"]):
        return None
    out.partitions.update(root[1] for root in doc["r"] if root[0] == topic)
    out.watermarks += len(doc["r"]) - len(kept)
    doc["r"] = kept
    if not kept:  # nothing else fed it: it starts over (a held one waits for its first event)
        doc["v"] = None
        if "h" in doc:
            doc["h"] = -1
    return json.dumps(doc, separators=(",", ":")).encode()


def forget_topic(stores: Mapping[str, StateStore], pipeline: Pipeline,
                 topic: str, expire_after: float = 0.0) -> Forgotten:
    """Drop ``topic``'s watermarks, dedup tables and log marks from every store (see the
    module doc); answers what was changed. A state rewritten keeps expiring
    (``expire_after``: the worker's default), its clock started again."""
    out = plan(stores, pipeline, topic)
    if not out.rows:
        log.warning("forget %s: pipeline %r holds nothing of that topic", topic, pipeline.id)
        return out
    source = epoch_source(stores.values())
    share_epochs(source, stores.values())
    guard = None
    if source is not None:
        taken = source.take_epochs(sorted((topic, p) for p in out.partitions))
        guard, out.epoch = taken.guard, taken.epoch
        log.warning("forget %s: took epoch %d for partitions %s (a worker still holding "
                    "them is fenced)", topic, taken.epoch, sorted(out.partitions))
    specs = {spec.id: spec for spec in pipeline.aggregates}
    for (store, stage), rows in sorted(out.rows.items()):
        spec = specs.get(stage)
        ttl = 0.0 if spec is None else \
            expire_after if spec.expire_after is None else spec.expire_after
        lasting = frozenset(key for key, row in rows.items() if spec is not None
                            and spec.window is not None
                            and has_open_window(decode_state(row).value))
        plain, expiring_rows = split_states(StageRows(stage, store, rows, {}, ttl, lasting))
        if plain:
            stores[store].save(stage, plain, guard=guard)
        if expiring_rows:
            stores[store].save_expiring(stage, expiring_rows, ttl, guard=guard)
        log.warning("forget %s: pipeline %r, %s store, stage %s: %d rows rewritten", topic,
                    pipeline.id, store, stage, len(rows))
    log.warning("forget %s: %d watermarks dropped; the topic's events from now on are "
                "counted as new", topic, out.watermarks)
    return out


def forget(settings: Settings, pipeline: Pipeline, topic: str) -> Forgotten:
    """``forget_topic`` on the configured stores, then the topic's runs in the merge log
    (its forget record carries an epoch just taken: above every append before it); for a
    pipeline without a store, the topic's marks in its marks topic."""
    from onceflow.runtime.join_setup import forget_merge_log
    from onceflow.runtime.wiring import open_stores

    stores = open_stores(settings, pipeline)
    if not stores:  # a stateless republisher: its marks are all it keeps of T
        from onceflow.runtime.log_marks_setup import forget_log_marks

        done = Forgotten(topic)
        done.add_marks("kafka", forget_log_marks(settings, pipeline, topic))
        return done
    try:
        done = forget_topic(stores, pipeline, topic, settings.state.expire_after)
        source = epoch_source(stores.values())
        epoch = done.epoch
        if epoch is None:  # nothing written: an epoch above every append all the same
            epoch = 0 if source is None else source.take_epochs([(topic, 0)]).epoch
    finally:
        for store in stores.values():
            store.close()
    done.merge_log_partitions = forget_merge_log(settings, pipeline, topic, epoch)
    if done.merge_log_partitions:
        log.warning("forget %s: pipeline %r, its runs dropped from the merge log (%d "
                    "partitions, epoch %d)", topic, pipeline.id, done.merge_log_partitions,
                    epoch)
    return done


def cli(argv: list[str]) -> int:
    """``onceflow forget -c app.conf --topic T``: exit 0 done, 2 bad configuration."""
    parser = argparse.ArgumentParser(
        prog="onceflow forget",
        description="Drop what a deleted topic's old log left in the pipeline's stores "
                    "(watermarks, producer-dedup tables, log marks, a join table's rows) "
                    "and merge log (without a store: its log marks topic), so the events of a "
                    "topic re-created under its name are counted. Stop every worker of "
                    "the pipeline first.")
    parser.add_argument("-c", "--config", required=True, help="application HOCON file")
    parser.add_argument("--topic", required=True, help="the re-created root topic")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable)")
    args = parser.parse_args(argv)
    from onceflow.runtime.wiring import load_pipeline

    try:
        overrides = dict(split_assignment(a) for a in args.set)
        settings = load_settings(args.config, overrides)
        pipeline = load_pipeline(settings)
    except (ConfigError, ValueError) as error:
        print(f"onceflow: config error: {error}", file=sys.stderr)
        return 2
    if args.topic not in pipeline.topics:
        log.warning("forget %s: not an input topic of pipeline %r (%s); its routes are "
                    "dropped all the same", args.topic, pipeline.id, sorted(pipeline.topics))
    done = forget(settings, pipeline, args.topic)
    downstream = downstream_note(pipeline.republished_to, args.topic)
    if downstream:
        log.warning("forget %s: %s", args.topic, downstream)
    print(json.dumps({"topic": args.topic, "watermarks": done.watermarks,
                      "partitions": sorted(done.partitions),
                      "merge_log_partitions": done.merge_log_partitions,
                      "rows": {f"{store}/{stage}": len(rows)
                               for (store, stage), rows in sorted(done.rows.items())}}))
    return 0

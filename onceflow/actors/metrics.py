"""The worker's metrics, one registry per process, updated by the actors.

Counters are cumulative over the process's life (across supervised
restarts), so a restart shows up as a step in ``stream_starts`` and
``restarts``, not as a reset. ``last_progress`` is the monotonic time at
which records were last processed or offsets last committed: health turns
bad when it stops moving while there is lag.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

RECORDS = Counter("onceflow_records", "Records consumed and processed", registry=REGISTRY)
FOLDED = Counter("onceflow_folded", "Values folded into aggregates", ["stage"], registry=REGISTRY)
DUPLICATES = Counter("onceflow_duplicates_discarded", "Replayed values discarded", ["stage"],
                     registry=REGISTRY)
PRODUCER_DUPLICATES = Counter("onceflow_producer_duplicates", "Source records dropped as a "
                              "producer's re-send (sequence not above the last)", ["stage"],
                              registry=REGISTRY)
LATE = Counter("onceflow_late_events", "Values too late for their window", ["stage"],
               registry=REGISTRY)
DEAD_LETTERS = Counter("onceflow_dead_letters", "Records sent to the dead-letter topic",
                       registry=REGISTRY)
MISALIGNED = Counter("onceflow_misaligned_records", "Records dead-lettered because a key they "
                     "feed has its home on another input partition (repartition needed)",
                     ["stage"], registry=REGISTRY)
STATE_LOADS = Counter("onceflow_state_loads", "Keys read from the store because they were not "
                      "cached: first sight, after an eviction, or after a restart or "
                      "rebalance dropped the cache", ["stage"], registry=REGISTRY)
STATE_RELOADS = Counter("onceflow_state_reloads", "Keys loaded that the store already held: "
                        "evicted from the cache earlier, or cached before a restart or "
                        "rebalance", ["stage"], registry=REGISTRY)
STATE_EVICTIONS = Counter("onceflow_state_evictions", "Written states dropped from the cache "
                          "(onceflow.state.cache.max-states); they reload on their next record",
                          ["stage"], registry=REGISTRY)
CACHED_STATES = Gauge("onceflow_cached_states", "States held in memory", ["stage"],
                      registry=REGISTRY)
CACHED_STATE_BYTES = Gauge("onceflow_cached_state_encoded_bytes", "Sum of the cached states' "
                           "encoded sizes as last loaded or written (a cheap proxy: in memory "
                           "a small state takes about 12 times its encoding)", ["stage"],
                           registry=REGISTRY)
PERSISTED = Counter("onceflow_persisted_states", "State rows written", ["stage"],
                    registry=REGISTRY)
STORE_SECONDS = Histogram("onceflow_store_write_seconds", "Time to write one stage's rows",
                          ["store"], registry=REGISTRY)
COMMITTED = Gauge("onceflow_committed_offset", "Committed offset (durable low-watermark)",
                  ["topic", "partition"], registry=REGISTRY)
LAG = Gauge("onceflow_consumer_lag", "High watermark from the last fetch minus position",
            ["topic", "partition"], registry=REGISTRY)
STREAM_STARTS = Counter("onceflow_stream_starts", "Kafka consumer streams (re)created",
                        registry=REGISTRY)
OUTBOX = Gauge("onceflow_outbox_records", "Records in the producer outbox, not yet delivered",
               registry=REGISTRY)
OUTBOXED = Counter("onceflow_outboxed", "Records written to the outbox after a failed delivery",
                   registry=REGISTRY)
PRODUCE_FAILURES = Counter("onceflow_produce_failures", "Failed batch deliveries (each is "
                           "retried or outboxed)", ["topic"], registry=REGISTRY)
REFETCHES = Counter("onceflow_offset_refetches", "Re-fetches of a partition from the first "
                    "offset a fetch skipped", ["topic", "partition"], registry=REGISTRY)
FETCH_STARVED = Counter("onceflow_fetch_starved", "Times a partition's fetches brought no "
                        "records for seconds while its log held some (the fetch max wait "
                        "was doubled, or the stream re-created)", ["topic", "partition"],
                        registry=REGISTRY)
GAPS_ACCEPTED = Counter("onceflow_offset_gaps_accepted", "Holes in a partition's offsets still "
                        "there after every re-fetch, moved past", ["topic", "partition"],
                        registry=REGISTRY)
JOIN_TIMEOUTS = Counter("onceflow_join_timeouts", "Consumers re-created because a group join "
                        "did not complete within join-timeout", registry=REGISTRY)
FENCED = Counter("onceflow_fenced_writes", "Snapshot or outbox writes the store refused because "
                 "another worker took one of their input partitions over (this one was "
                 "paused past its session timeout); each restarts the pipeline",
                 registry=REGISTRY)
RESTARTS = Counter("onceflow_restarts", "Supervised restarts", ["child"], registry=REGISTRY)
REPUBLISHED = Counter("onceflow_republished", "Records republished (republish and repartition "
                      "steps), handed to the producer, by output topic", ["topic"],
                      registry=REGISTRY)
EXCLUSIVE_SKIPPED = Counter("onceflow_exclusive_skipped", "Outputs of exclusive republish steps "
                            "a replay left out because the output topic already held them",
                            ["topic"], registry=REGISTRY)
SIDE_SKIPPED = Counter("onceflow_side_outputs_skipped", "Dead letters and late events a replay "
                       "left out because their topic already held them", registry=REGISTRY)
COMMIT_SECONDS = Histogram("onceflow_commit_seconds", "Time to commit offsets to Kafka (one "
                           "successful commit; its count is the number of commits)",
                           registry=REGISTRY)
LAST_COMMIT = Gauge("onceflow_last_commit_timestamp_seconds", "Unix time of the last commit "
                    "(the worker's start before the first one)", registry=REGISTRY)
LAST_COMMIT.set_to_current_time()


class Labelled(Collector):
    """``REGISTRY`` with constant labels on every sample (``pipeline``): what /metrics serves.

    prometheus_client has no constant labels, so the samples are copied at scrape time.
    """

    def __init__(self, labels: dict[str, str], names: frozenset[str] | None = None):
        self._labels = labels
        self._names = names

    def restricted(self, names: Iterable[str]) -> Labelled:
        """Only the samples named in ``names``: the ``name[]`` query of /metrics, as
        prometheus_client's own handler has it (a poller that reads one counter often
        need not have every family rendered each time)."""
        return Labelled(self._labels, frozenset(names))

    def collect(self) -> Iterator[Metric]:
        names = self._names
        for family in REGISTRY.collect():
            samples = family.samples if names is None else [
                sample for sample in family.samples if sample.name in names]
            if names is not None and not samples:  # unrestricted: every family, even empty
                continue
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = [sample._replace(labels={**sample.labels, **self._labels})
                            for sample in samples]
            yield copy


_last_progress = time.monotonic()
_last_commit = time.monotonic()  # or the start: a fresh worker has had no reason to commit
_commits = 0  # commits that moved offsets: the supervisor's measure of progress


def progressed() -> None:
    global _last_progress
    _last_progress = time.monotonic()


def committed() -> None:
    global _last_commit, _commits
    _last_commit = time.monotonic()
    _commits += 1
    LAST_COMMIT.set_to_current_time()
    progressed()


def commits() -> int:
    """How many commits moved offsets so far in this process."""
    return _commits


def seconds_since_commit() -> float:
    return time.monotonic() - _last_commit


def outbox_records() -> int:
    """Records in the outbox not delivered yet (commits wait for them)."""
    return int(sum(sample.value for metric in OUTBOX.collect() for sample in metric.samples))


def seconds_since_progress() -> float:
    return time.monotonic() - _last_progress


def total_lag() -> float:
    return sum(sample.value for metric in LAG.collect() for sample in metric.samples)

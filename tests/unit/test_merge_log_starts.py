"""A merge log is read from where the committed offsets allow, not from its start.

A long-lived worker appends to its merge log at every batch; read whole at each
assignment, it would take longer and longer until the worker could not start. Once
offsets are committed, ``LogStarts`` names the first append holding a run not below
them, the snapshot keeps it (``MERGE_LOG_STAGE``), and the next reader starts there
with the highest epoch before it, so a zombie's late append past it is still dropped.
"""

from __future__ import annotations

from typing import Any

from test_join import categories, merchant, payment, payments

from onceflow.kafka.merge_log_topic import decode_all, decode_appends, encode
from onceflow.stages.merge_log import (
    Append,
    LogStarts,
    MemoryMergeLog,
    Run,
    Start,
    decode_start,
    encode_start,
)
from onceflow.testing import TestRun


def test_a_start_moves_past_the_appends_whose_runs_are_all_committed() -> None:
    starts = LogStarts()
    starts.read(0, None, [Append(0, 1, [Run("payments", 0, 4)]),
                          Append(1, 1, [Run("merchants", 0, 1), Run("payments", 5, 6)])])
    starts.appended(0, Append(5, 2, [Run("payments", 7, 9)]))
    starts.committed({("payments", 5): 9})  # another partition's offsets move nothing
    assert starts.take() == {}
    starts.committed({("payments", 0): 5})  # the first append only
    assert starts.take() == {0: Start(1, 1)}  # the epoch of what it passed, not of its own
    starts.committed({("payments", 0): 7})  # merchants 0..1 not committed: stays
    assert starts.take() == {}
    starts.committed({("payments", 0): 10, ("merchants", 0): 2})  # every append
    assert starts.take() == {0: Start(6, 2)}  # past the last one this runner knows
    starts.committed({("payments", 0): 10, ("merchants", 0): 2})
    assert starts.take() == {}  # taken once


def test_a_single_workers_runs_are_committed_per_partition() -> None:
    starts = LogStarts()
    starts.read(0, Start(3, 4), [Append(3, 4, [Run("in", 0, 9, 0), Run("in", 0, 5, 1)])])
    starts.committed({("in", 0): 10})
    assert starts.take() == {}
    starts.committed({("in", 0): 10, ("in", 1): 6})
    assert starts.take() == {0: Start(4, 4)}


def test_a_read_from_a_start_drops_a_zombies_append_as_a_whole_read_does() -> None:
    values = [encode(1, [Run("payments", 0, 4)]), encode(2, [Run("payments", 5, 6)]),
              encode(1, [Run("payments", 5, 9)]),  # the old owner's, landed late
              encode(2, [Run("payments", 7, 8)])]
    records = list(enumerate(values))
    whole = decode_all(records)
    assert whole == [Run("payments", 0, 4), Run("payments", 5, 6), Run("payments", 7, 8)]
    # from offset 2 (the zombie's): with the epoch before it, as the whole read
    assert [run for a in decode_appends(records[2:], 2) for run in a.runs] == whole[2:]
    assert [run for a in decode_appends(records[2:], 0) for run in a.runs] != whole[2:]


def test_a_start_written_after_its_own_appends_keeps_the_runs_of_the_member_before() -> None:
    """A member (epoch 4) takes over a co-partition whose previous owner (epoch 3) logged
    runs it applied but did not commit, then appends its own. The start its snapshot
    keeps lies before the old owner's last runs: read from there with the start's epoch,
    they must still be there (an epoch taken from its own appends dropped them, and the
    next replay met other rows: the join under SIGKILL split payments)."""
    records = list(enumerate([
        encode(3, [Run("payments", 0, 4)]),
        encode(3, [Run("merchants", 0, 1)]),
        encode(3, [Run("payments", 5, 9)]),  # applied by the old owner, not committed
        encode(4, [], 3),  # the new owner's mark, right after its read
        encode(4, [Run("payments", 10, 12)]),  # the new owner's own append
    ]))
    starts = LogStarts()
    starts.read(0, None, decode_appends(records[:3]))
    starts.appended(0, Append(4, 4, [Run("payments", 10, 12)]))
    starts.committed({("payments", 0): 5, ("merchants", 0): 2})  # the positions it began at
    start = starts.take()[0]
    assert start == Start(2, 3)
    read = [run for a in decode_appends(records[start.offset:], start.epoch) for run in a.runs]
    assert read == [Run("payments", 5, 9), Run("payments", 10, 12)]
    assert read == decode_all(records)[2:]  # as a whole read gives them


def test_a_start_row_round_trips_and_a_broken_one_reads_the_whole_log() -> None:
    assert decode_start(encode_start(Start(12, 3))) == Start(12, 3)
    assert decode_start(b"nonsense") is None
    assert decode_start(b"-1 0") is None


class CountingLog(MemoryMergeLog):
    """Notes where each read began."""

    def __init__(self) -> None:
        super().__init__()
        self.read_from: list[int] = []

    def read(self, partition: int, start: Start | None = None) -> list[Append]:
        self.read_from.append(0 if start is None else start.offset)
        return super().read(partition, start)


def test_after_commits_a_restart_reads_the_log_from_past_its_committed_appends() -> None:
    run = TestRun(payments())
    log = run.merge_log = CountingLog()
    run.runner = run._new_runner()  # on the counting log
    for n in range(6):  # a commit after each batch: the appends before it are done
        run.feed([merchant("m1", f"cat{n}"), payment("m1", n)])
        run.commit()
    run.feed([payment("m1", 100)])
    run.feed([merchant("m1", "late")])
    run.persist()  # nothing more committed
    run.crash()
    run.feed([payment("m1", 200)])
    first_read, replay_read = log.read_from[0], log.read_from[-1]
    assert first_read == 0 and replay_read > 0, log.read_from
    assert len(log.logged[0][replay_read:]) < len(log.logged[0]) / 2
    # the replay met what the first run met: payment 100 under cat5 both times
    replayed: dict[int, Any] = {}
    for offset, category in categories(run):
        assert replayed.setdefault(offset, category) == category
    assert replayed[6] == "cat5" and replayed[7] == "late"
    assert run.states("totals") == {**{f"cat{n}": n for n in range(6)}, "cat5": 105,
                                    "late": 200}


def test_an_input_idle_since_the_assignment_does_not_hold_the_start_back() -> None:
    """The worker's committed offsets name only what this incarnation committed: a table
    partition with no record since the assignment is at its position all the same."""
    from onceflow.stages.join_runner import JoinRunner
    from onceflow.testing import Consumed

    log = MemoryMergeLog()
    log.append({0: [Run("merchants", 0, 0)]})
    log.append({0: [Run("payments", 0, 0)]})
    runner = JoinRunner(payments(), lambda spec, keys: {}, "dead", merge_log=log,
                        positions={("merchants", 0): 1, ("payments", 0): 1})
    runner.process([Consumed("payments", 0, 1, b'{"merchant": "m1", "amount": 3}', b"m1")])
    runner.committed({("payments", 0): 2})  # merchants: nothing new to commit
    assert runner.take_log_starts() == {0: Start(4, 0)}  # past the two, the read's mark, its own


def test_a_start_moves_back_where_the_log_restarted_below_it() -> None:
    """A merge log topic re-created while the store kept its start: the appends now lie
    below the stored start, and the start follows them down (reading more is safe)."""
    starts = LogStarts()
    starts.read(0, Start(100, 3), [])  # the new log ended below 100: nothing read there
    starts.appended(0, Append(0, 4, [Run("payments", 0, 4)]))
    starts.appended(0, Append(1, 4, [Run("payments", 5, 9)]))
    starts.committed({("payments", 0): 5})
    assert starts.take() == {0: Start(1, 4)}

"""Window-clock rows and producer-sequence tables that are no onceflow rows stop the worker
naming the stage, the key and the row (issue 29: "A state already in the store that cannot
be decoded stops the worker"), as undecodable aggregate states do; rows onceflow wrote pass.

Read back from a real Redis, through the same check the pipeline actor's loaders apply.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from onceflow.checkpoint.stored_rows import checked_sequence_rows, checked_window_rows
from onceflow.devtools.services import ServiceInfo
from onceflow.runtime.worker import _permanent
from onceflow.stages.producer_dedup import SEQUENCE_STAGE, PartitionSequences
from onceflow.stages.watermark import WINDOWS_STAGE, PartitionWatermark, row_key
from onceflow.stores.base import UndecodableState
from onceflow.stores.redis_store import RedisStore

TP = ("robots", 3)
WM, OPEN = row_key("per_minute", "wm", TP), row_key("per_minute", "open", TP)


@pytest.fixture
def store(redis_service: ServiceInfo, unique_name: Callable[..., str]) -> Iterator[RedisStore]:
    redis = RedisStore(f"redis://{redis_service.address}/0", unique_name("p"), "inspect")
    try:
        yield redis
    finally:
        redis.close()


def stored(store: RedisStore, namespace: str, rows: dict[str, bytes]) -> dict[str, bytes]:
    store.save(namespace, rows)
    return store.load(namespace, list(rows))


def test_rows_onceflow_wrote_pass(store: RedisStore) -> None:
    rows = {WM: PartitionWatermark(60_000, {TP: 1_700_000_000_000}, None, 1_699_999_000_000
                                   ).encode(),
            OPEN: json.dumps(["robot-1", "robot-2"]).encode()}
    assert checked_window_rows(store, stored(store, WINDOWS_STAGE, rows)) == rows
    table = PartitionSequences(120, 3, {"device-7": [1, 44, 118]}).encode()
    old = json.dumps({"next": 9, "dups": 0, "producers": {"d": [0, 2]}}).encode()  # timestamp rule
    sequences = {"robots|3": table, "robots|4": old}
    assert checked_sequence_rows(store, stored(store, SEQUENCE_STAGE, sequences)) == sequences


@pytest.mark.parametrize(("key", "row", "why"), [
    (WM, b"\x00garbage", "JSONDecodeError: Expecting value"),
    (WM, b'{"r": [["robots", 3, 5]]}', "KeyError: 'v'"),
    (WM, b'{"r": [["robots", 3, "soon"]], "v": 4}',
     "TypeError: roots [['robots', 3, 'soon']] are not"),
    (WM, b'{"r": [], "v": "late"}', "TypeError: watermark 'late' is not an integer"),
    (OPEN, b'{"robot-1": 1}', "TypeError: {'robot-1': 1} is not a list of keys"),
    (OPEN, b"[[1, 2]]", "TypeError: [[1, 2]] is not a list of keys"),
])
def test_an_undecodable_window_row_names_the_stage_the_key_and_the_row(
        store: RedisStore, key: str, row: bytes, why: str) -> None:
    with pytest.raises(UndecodableState) as caught:
        checked_window_rows(store, stored(store, WINDOWS_STAGE, {key: row}))
    error = caught.value
    assert (error.stage_id, error.key, error.row) == (
        "per_minute", key, store.row_name(WINDOWS_STAGE, key))
    assert f"(not a onceflow window clock row: {why}" in str(error)
    assert str(error).startswith(f"the stored state of stage 'per_minute', key {key!r} cannot "
                                 "be decoded")
    assert _permanent(error)  # the supervisor escalates at once: no restart loop


@pytest.mark.parametrize(("row", "why"), [
    (b"[]", "TypeError: [] is not an object"),
    (b'{"next": 4, "dups": 0, "producers": {"d": [1, 2, "x"]}, "seen": "offset"}',
     "TypeError: producer 'd': [1, 2, 'x'] is not [epoch, sequence, offset]"),
    (b'{"next": "4", "dups": 0, "producers": {}, "seen": "offset"}', "TypeError: next offset '4'"),
    (b'{"next": 4, "producers": {}}', "KeyError: 'dups'"),
])
def test_an_undecodable_producer_sequence_table_names_its_key_and_row(
        store: RedisStore, row: bytes, why: str) -> None:
    with pytest.raises(UndecodableState) as caught:
        checked_sequence_rows(store, stored(store, SEQUENCE_STAGE, {"robots|3": row}))
    error = caught.value
    assert (error.stage_id, error.key, error.row) == (
        SEQUENCE_STAGE, "robots|3", store.row_name(SEQUENCE_STAGE, "robots|3"))
    assert f"(not a onceflow producer sequence table: {why}" in str(error)
    assert _permanent(error)

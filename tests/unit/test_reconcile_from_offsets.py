"""``--from-offsets``: what it accepts."""

from __future__ import annotations

import pytest

from onceflow.reconcile.cut import parse_from_offsets


def test_earliest_a_time_in_iso_8601_or_epoch_ms() -> None:
    assert parse_from_offsets("earliest") is None
    assert parse_from_offsets("committed-at:1700000000000") == 1_700_000_000_000
    assert parse_from_offsets("committed-at:2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_from_offsets("committed-at:2023-11-14T22:13:20") == 1_700_000_000_000  # UTC
    assert parse_from_offsets("committed-at:2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    for wrong in ("latest", "committed-at:yesterday", "committed-at:"):
        with pytest.raises(ValueError, match="--from-offsets"):
            parse_from_offsets(wrong)

"""``onceflow status``'s lag arithmetic and table (the Kafka side is in
tests/integration/test_states_and_lag.py)."""

from __future__ import annotations

import pytest

from onceflow.runtime import status
from onceflow.runtime.lag import GroupLag, PartitionLag


def test_lag_counts_from_the_log_start_when_nothing_is_committed() -> None:
    lag = GroupLag("g", (PartitionLag("t", 0, None, 7), PartitionLag("t", 1, 5, 9),
                         PartitionLag("t", 2, 4, 4)), ("t-by-key",))
    assert [p.lag for p in lag.partitions] == [7, 4, 0]
    assert lag.total == 11


def test_table_names_every_partition_and_missing_topics(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    status._print_lag(GroupLag("g", (PartitionLag("orders", 0, None, 7),
                                     PartitionLag("orders", 1, 5, 9)), ("by-key",)), False)
    assert capsys.readouterr().out.splitlines() == [
        "group g: lag 11 over 2 partitions",
        "topic   partition  committed  end  lag",
        "orders  0          -          7    7",
        "orders  1          5          9    4",
        "by-key: no such topic (yet)",
    ]


def test_status_needs_a_config_or_an_url(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        status.cli([])
    assert stopped.value.code == 2
    assert "give -c or --url" in capsys.readouterr().err

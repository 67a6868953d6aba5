"""The user API is typed for mypy: ``Pipeline[T]`` carries each step's value type to the next.

One mypy run over two small pipelines as a user writes them: the right one type-checks,
the wrong one (a fold whose value is not the pipeline's, a key that is no ``str``, a
step reading a field the value has not) fails on exactly those lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onceflow

ROOT = Path(onceflow.__file__).parent.parent

COMMON = '''\
from __future__ import annotations

import json
from dataclasses import dataclass

from onceflow import Pipeline
from onceflow.stages import Tumbling
from onceflow.testing import Record, TestRun


@dataclass
class Order:
    sku: str
    qty: int
    ts: int


def parse(payload: bytes) -> Order:
    return Order(**json.loads(payload))


'''

RIGHT = COMMON + '''\
def add(total: int, order: Order) -> int:
    return total + order.qty


orders = Pipeline("orders", topics=("orders",), decode=parse)
totals = (orders.filter("some", lambda o: o.qty > 0)
          .aggregate("qty", key=lambda o: o.sku, init=lambda: 0, fold=add)
          .aggregate("per-minute", key=lambda o: o.sku, init=lambda: 0,
                     fold=lambda n, o: n + o.qty, window=Tumbling(60_000, lambda o: o.ts)))
skus: Pipeline[str] = totals.flat_map("units", lambda o: [o.sku] * o.qty).map("up", str.upper)
meta: Pipeline[int] = (Pipeline("m", topics=("orders",), decode=parse, with_meta=True)
                       .map("offset", lambda pair: pair[1].offset + pair[0].qty))
untyped = Pipeline("any", topics=("raw",), format="json").map("x", lambda v: v["x"])
rekeyed: Pipeline[Order] = orders.repartition("by-sku", key=lambda o: o.sku, decode=parse)
out = orders.republish("out", "orders-out", key=lambda o: o.sku, event_time_ms=lambda o: o.ts)
states: dict[str, object] = TestRun(totals).states("qty")
TestRun(skus).feed([Record({"sku": "a", "qty": 1, "ts": 0})])
'''

WRONG = COMMON + '''\
def add(total: int, label: str) -> int:
    return total + len(label)


orders = Pipeline("orders", topics=("orders",), decode=parse)
orders.aggregate("qty", key=lambda o: o.sku, init=lambda: 0, fold=add)  # E: fold
orders.map("qty", lambda o: o.qty).aggregate("k", key=lambda q: q, init=int,  # E: key
                                             fold=lambda n, q: n + q)
orders.map("sku", lambda o: o.sku).filter("big", lambda s: s.qty > 1)  # E: field
'''


def test_mypy_accepts_a_right_pipeline_and_finds_each_wrong_signature(tmp_path: Path) -> None:
    (tmp_path / "right.py").write_text(RIGHT)
    (tmp_path / "wrong.py").write_text(WRONG)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", "/dev/null",
         "--config-file", "/dev/null", "--follow-imports", "silent", "--python-version", "3.11",
         "right.py", "wrong.py"],
        cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": ""}, capture_output=True, text=True,
        timeout=300, check=False)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [e for e in errors if e.startswith("right.py")] == [], result.stdout
    lines = WRONG.splitlines()
    marked = {n + 1 for n, line in enumerate(lines) if "# E:" in line}
    found = {int(m.group(1)) for e in errors if (m := re.match(r"wrong\.py:(\d+):", e))}
    assert found == marked, result.stdout
    assert 'Argument "fold" to "aggregate"' in result.stdout
    assert '"str" has no attribute "qty"' in result.stdout

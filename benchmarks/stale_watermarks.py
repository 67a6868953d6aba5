"""What each watermark route costs an aggregate state, encoded and in memory.

A state keeps one watermark per route (``onceflow.stages.lineage.route_of``):
its root topic/partition, plus the partitions of the hops in between for
events re-keyed twice or more. Routes are never pruned, so the routes of
partitions that stopped feeding a key (a topic replaced, a republisher
re-routed, upstream re-partitioned) stay in every state they reached. This
computes, with the real ``encode_state``/``decode_state``, the encoded size of
typical small states with 1, 4, 16, 64 and 256 routes, the bytes each extra
route adds, and what that is for 1M keys. In memory: ``tracemalloc`` over
``--copies`` decoded states (what a reload from the store builds). Pure
computation, no services; a few seconds.

    python benchmarks/stale_watermarks.py [--offset 123456789] [--copies 500]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import append, journal_page

from onceflow.stages.lineage import Position, Route
from onceflow.stages.state import AggregateState, decode_state, encode_state

ROUTES = (1, 4, 16, 64, 256)
KEYS = 1_000_000
ROOT, HOP = "orders", "orders-by-customer"  # as onceflow.examples.orders / regroup
HOME = (HOP, 3)

#: name -> (initial value, route of the i-th partition, position at offset o).
Shape = tuple[Any, Callable[[int], Route], Callable[[int], Position]]
SHAPES: dict[str, Shape] = {
    # A count behind one re-keying: one route per root partition, position
    # (root offset, republish index).
    "int, 1 hop": (1234, lambda i: (ROOT, i), lambda o: (o, 0)),
    "small dict, 1 hop": ({"ok": 1234, "failed": 56}, lambda i: (ROOT, i), lambda o: (o, 0)),
    # Re-keyed twice: a route names the root partition and the middle hop's
    # partition; positions gain the second hop's index.
    "small dict, 2 hops": ({"ok": 1234, "failed": 56},
                           lambda i: (f"{ROOT}/{i // 16}>{HOP}", i % 16),
                           lambda o: (o, 0, 0)),
}


def state(shape: Shape, routes: int, offset: int) -> AggregateState:
    value, route, position = shape
    return AggregateState(value, {route(i): position(offset + i) for i in range(routes)}, HOME)


def in_memory(data: bytes, copies: int) -> float:
    """Bytes one decoded state holds (value, watermarks, home), averaged over ``copies``."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [decode_state(data) for _ in range(copies)]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return (after - before) / copies


def measure(offset: int, copies: int) -> dict[str, list[tuple[int, int, float]]]:
    """shape -> [(routes, encoded bytes, in-memory bytes)]."""
    results: dict[str, list[tuple[int, int, float]]] = {}
    for name, shape in SHAPES.items():
        rows = []
        for n in ROUTES:
            data = encode_state(state(shape, n, offset))
            assert decode_state(data).watermarks == state(shape, n, offset).watermarks
            rows.append((n, len(data), in_memory(data, copies)))
        results[name] = rows
    return results


def size(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:,.1f} {unit}"
    return f"{b:,.0f} B"


def render(args: argparse.Namespace, results: dict[str, list[tuple[int, int, float]]]) -> str:
    lines = [
        f"## stale_watermarks.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `.venv/bin/python benchmarks/stale_watermarks.py --offset {args.offset} "
        f"--copies {args.copies}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; no services "
        f"(sizes, not timing). Root topic `{ROOT}`, re-keyed through `{HOP}`; root offsets "
        f"near {args.offset:,}; each state has its home. In memory: tracemalloc over "
        f"{args.copies} decoded states.",
        "",
        "| state | routes | encoded bytes | in memory bytes | encoded, 1M keys | "
        "in memory, 1M keys |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    summary = []
    for name, rows in results.items():
        for n, encoded, memory in rows:
            lines.append(f"| {name} | {n} | {encoded:,} | {memory:,.0f} | "
                         f"{size(encoded * KEYS)} | {size(memory * KEYS)} |")
        (n1, e1, m1), (nn, en, mn) = rows[0], rows[-1]
        per_encoded, per_memory = (en - e1) / (nn - n1), (mn - m1) / (nn - n1)
        summary.append(f"- {name}: **{per_encoded:.1f} bytes encoded and {per_memory:.0f} "
                       f"bytes in memory per extra route**; 63 stale routes on 1M keys: "
                       f"{size(63 * per_encoded * KEYS)} in the store, "
                       f"{size(63 * per_memory * KEYS)} if all cached.")
    lines += ["", *summary, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--offset", type=int, default=123_456_789,
                        help="root offsets (digits cost bytes: each digit less, 1 byte less)")
    parser.add_argument("--copies", type=int, default=500)
    parser.add_argument("--out", type=Path, default=journal_page(),
                        help="the page the run's section is appended to (default: today's, UTC)")
    args = parser.parse_args()
    report = render(args, measure(args.offset, args.copies))
    print(report)
    append(args.out, report)


if __name__ == "__main__":
    main()

"""Top-N of a py-spy profile (``--format raw`` collapsed stacks), by self and total time.

    python benchmarks/profile_top.py DIR/worker-1.txt [--top 10] [--threads]

Self time: samples whose innermost frame is the function. Total time: samples
with the function anywhere on the stack (counted once per sample). Idle
samples (threads waiting in ``select``/``poll``/locks) are counted apart, so
the percentages are of busy samples. ``--threads`` splits busy samples by
thread first.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

IDLE = re.compile(r"^(select|poll|epoll_wait|wait|_wait_for_tstate_lock|acquire|sleep|"
                  r"_worker|get|recv_into|accept|read)\b")
FRAME = re.compile(r"^(?P<fn>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def short(frame: str) -> str:
    """``fold (onceflow/stages/runner.py:310)`` -> ``runner.py:fold``."""
    match = FRAME.match(frame)
    if not match:
        return frame
    return f"{Path(match['file']).name}:{match['fn']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--threads", action="store_true")
    args = parser.parse_args()
    self_time: Counter[str] = Counter()
    total: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    busy = idle = 0
    for line in args.profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else ""
        frames = [f for f in frames if not f.startswith(("thread", "process"))]
        if not frames:
            continue
        leaf = short(frames[-1])
        if IDLE.match(leaf.split(":", 1)[-1].rsplit(".", 1)[-1]):
            idle += n
            continue
        busy += n
        threads[thread] += n
        self_time[leaf] += n
        for fn in {short(f) for f in frames}:
            total[fn] += n
    print(f"{busy:,} busy samples, {idle:,} idle (waiting) samples")
    if args.threads:
        for thread, n in threads.most_common():
            print(f"  {100 * n / busy:5.1f}%  {thread}")
    for title, table in (("self", self_time), ("total", total)):
        print(f"\nTop {args.top} by {title} time (% of busy samples):")
        for fn, n in table.most_common(args.top):
            print(f"  {100 * n / busy:5.1f}%  {fn}")


if __name__ == "__main__":
    main()

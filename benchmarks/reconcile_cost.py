"""How long ``onceflow reconcile`` takes, and its memory, over the robots' reports.

Starts its own Tansu broker and Redis, produces ``--messages`` robot reports
(1,000 robots, about 2% re-sent), runs one worker (demo.conf) until its group
committed everything, stops it, then runs ``onceflow reconcile`` in a process
of its own: the input replayed up to the committed offsets, every robot
compared. Prints the records read per second, its wall time and that process's
peak RSS (memory grows with the keys, not the records: compare two sizes).

    PYTHONPATH=. .venv/bin/python benchmarks/reconcile_cost.py --messages 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from onceflow.devtools import services
from onceflow.devtools.demo import redis_settings
from onceflow.devtools.harness import (
    CommittedOffsets,
    WorkerProcess,
    create_topic,
    packaged_config,
    produce,
    worker_command,
)
from onceflow.devtools.robot_stream import generate

#: The reconcile as a process of its own, printing its peak RSS last on stderr: VmHWM,
#: not ru_maxrss, which a child inherits from its parent at the fork (this process holds
#: the generated stream).
MEASURED = """
import json, re, sys
from pathlib import Path
from onceflow.runtime.cli import main
code = main(sys.argv[1:])
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1])
print(json.dumps({"peak_mb": peak / 1024}), file=sys.stderr)
sys.exit(code)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="reconcile-cost-"))
    kafka, store = services.start_tansu(state / "kafka"), services.start_redis(state / "redis")
    try:
        run = uuid.uuid4().hex[:8]
        topic, group, prefix = f"reports-{run}", f"g-{run}", f"p-{run}"
        settings = redis_settings(kafka.address, f"redis://{store.address}/0", group, prefix)
        stream = generate(args.messages, 1000, seed=5, resend=0.02)
        asyncio.run(create_topic(kafka.address, topic, args.partitions))
        ends = asyncio.run(produce(kafka.address, topic, stream.messages))
        del stream
        worker = WorkerProcess(worker_command(packaged_config("demo.conf"), settings),
                               {**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic}, state)
        worker.start()

        async def caught_up() -> bool:
            async with CommittedOffsets(kafka.address, group) as committed:
                return await committed.wait_for(topic, ends, 3600, worker)

        assert asyncio.run(caught_up()), worker.log_tail()
        assert worker.terminate(30) == 0, worker.log_tail()
        argv = ["reconcile", "-c", str(packaged_config("demo.conf")), "--report", str(state)]
        for key, value in settings.items():
            argv += ["--set", f'{key}="{value}"']
        done = subprocess.run([sys.executable, "-c", MEASURED, *argv], capture_output=True,
                              text=True, env={**os.environ, "ONCEFLOW_ROBOTS_TOPIC": topic})
        found = json.loads((state / "reconcile.json").read_text())
        peak = json.loads(done.stderr.strip().splitlines()[-1])["peak_mb"]
        print(f"records {found['records_read']:,}; robots {found['stages']['per_robot']}; "
              f"exit {done.returncode}; {found['seconds']:.1f} s, "
              f"{found['records_read'] / found['seconds']:,.0f} records/s; "
              f"peak RSS {peak:.0f} MB")
    finally:
        services.stop(kafka)
        services.stop(store)


if __name__ == "__main__":
    main()

"""Where a worker's threads run (``runtime.cpu_placement``): the rule, and real pinning of a
real process's threads (in a child process, so the test runner itself is never pinned)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from onceflow.runtime import cpu_placement
from onceflow.runtime.config import ConfigError, load_settings
from onceflow.runtime.cpu_placement import CpuPlacement, Sample, cpu_ticks, next_cpu, own_ticks

DEMO = Path(__file__).parents[2] / "onceflow" / "examples" / "demo.conf"
ALWAYS, NEVER = (lambda: True), (lambda: False)
needs_two = pytest.mark.skipif(not cpu_placement.supported() or len(os.sched_getaffinity(0)) < 2,
                               reason="pinning needs Linux and two CPUs")


def test_a_worker_alone_on_its_cpu_stays():
    assert next_cpu(0, {0: 0.95, 1: 0.30}, own=0.90, flip=ALWAYS) == 0


def test_a_crowded_worker_moves_where_it_gets_more_but_only_on_its_coin():
    busy = {0: 1.0, 1: 0.40}  # two workers share CPU 0 (half each); CPU 1 has 60% idle
    assert next_cpu(0, busy, own=0.50, flip=ALWAYS) == 1
    assert next_cpu(0, busy, own=0.50, flip=NEVER) == 0


def test_a_crowded_worker_with_nowhere_better_is_left_to_the_os():
    assert next_cpu(0, {0: 1.0, 1: 0.98}, own=0.50, flip=ALWAYS) is None


def test_an_unpinned_worker_pins_only_where_the_others_leave_room():
    assert next_cpu(None, {0: 0.70, 1: 0.45}, own=0.90, flip=ALWAYS) == 1  # others: 0.25
    assert next_cpu(None, {0: 0.70, 1: 0.45}, own=0.90, flip=NEVER) is None
    assert next_cpu(None, {0: 1.0, 1: 1.0}, own=0.90, flip=ALWAYS) is None  # others: 1.1


def test_the_readers_parse_proc(tmp_path: Path):
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text(
        "cpu  30 0 10 100 5 0 0 0 0 0\n"
        "cpu0 20 0 5 40 5 0 0 0 0 0\n"
        "cpu1 10 0 5 60 0 0 0 0 0 0\nintr 1 2 3\n")
    (tmp_path / "self" / "stat").write_text(
        "42 (a (strange) name) S " + " ".join(["1"] * 10) + " 17 4 " + " ".join(["0"] * 30))
    assert cpu_ticks(tmp_path) == {0: (25, 70), 1: (15, 75)}
    assert own_ticks(tmp_path) == 21


def test_the_setting_takes_auto_off_or_an_allowed_cpu():
    assert load_settings(DEMO).cpu == "auto"
    assert load_settings(DEMO, {"onceflow.cpu": "off"}).cpu == "off"
    with pytest.raises(ConfigError, match=r"onceflow\.cpu: expected auto, off"):
        load_settings(DEMO, {"onceflow.cpu": "fastest"})
    with pytest.raises(ConfigError, match=r"onceflow\.cpu"):
        load_settings(DEMO, {"onceflow.cpu": "4096"})


def test_off_and_a_single_cpu_place_nothing():
    assert not CpuPlacement("off").active
    placement = CpuPlacement("auto")
    placement._allowed = frozenset({0})
    assert not placement.active


CHILD = textwrap.dedent("""
    import os, threading, time
    from onceflow.runtime.cpu_placement import CpuPlacement

    def cpus():
        return {int(t): frozenset(os.sched_getaffinity(int(t)))
                for t in os.listdir("/proc/self/task")}

    started = threading.Event()
    early = threading.Thread(target=started.wait, daemon=True)
    early.start()  # a thread from before the placement
    placement = CpuPlacement({cpu})
    placement.start()
    placement.tick()
    late = threading.Thread(target=started.wait, daemon=True)
    late.start()  # one from after it: inherits
    pinned = cpus()
    placement.release()
    released = cpus()
    started.set()
    print(sorted(set(pinned.values())), len(pinned), sorted(set(released.values())))
""")


@needs_two
def test_a_number_pins_every_thread_of_the_process_and_release_frees_them():
    cpu = max(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", CHILD.replace("{cpu}", str(cpu))],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    allowed = frozenset(os.sched_getaffinity(0))
    assert out.strip() == f"[frozenset({{{cpu}}})] 3 [{allowed!r}]"


def test_a_proc_that_cannot_be_read_turns_auto_off_without_raising(tmp_path: Path):
    (tmp_path / "stat").write_text("cpu0 not numbers\n")
    placement = CpuPlacement("auto", proc=tmp_path)
    placement._allowed = frozenset({0, 1})
    placement.start()  # reads the stat file: ValueError, caught
    assert placement.mode == "off" and not placement.active
    placement.tick()  # and nothing more happens


def test_a_pinned_worker_whose_proc_breaks_is_left_to_the_os_without_raising(tmp_path: Path):
    (tmp_path / "stat").write_text("cpu0 1 2\n")  # too few fields: IndexError
    placement = CpuPlacement("auto", proc=tmp_path)  # no self/task either
    placement._allowed = frozenset({0, 1})
    placement._last, placement.pinned = Sample({0: (0, 0), 1: (0, 0)}, 0, 0.0), 0
    placement.tick()
    assert placement.mode == "off" and placement.pinned is None


class _Heads(random.Random):
    """A coin that always says move."""

    def random(self) -> float:
        return 0.0


def _write_proc(proc: Path, busy0: int, busy1: int, total: int, own: int) -> None:
    (proc / "self" / "task" / "999999999").mkdir(parents=True, exist_ok=True)  # no such thread
    (proc / "stat").write_text(f"cpu  0 0 0 0 0 0 0 0\n"
                               f"cpu0 {busy0} 0 0 {total - busy0} 0 0 0 0\n"
                               f"cpu1 {busy1} 0 0 {total - busy1} 0 0 0 0\n")
    (proc / "self" / "stat").write_text("1 (w) S " + " ".join(["0"] * 10) + f" {own} 0 " +
                                        " ".join(["0"] * 30))


def test_the_checks_read_proc_pin_where_there_is_room_then_move_when_crowded(tmp_path: Path):
    ticks = os.sysconf("SC_CLK_TCK")
    _write_proc(tmp_path, 0, 0, 0, 0)
    placement = CpuPlacement("auto", proc=tmp_path, chance=_Heads())
    placement._allowed = frozenset({0, 1})
    placement.start()
    # 3 s: CPU 0 10% busy, CPU 1 30%, this process 7% of a CPU: the others leave room
    placement._last = placement._last._replace(at=placement._last.at - 3.0)
    _write_proc(tmp_path, int(0.3 * ticks), int(0.9 * ticks), 3 * ticks, int(0.2 * ticks))
    placement._decide()
    assert placement.pinned == 0  # the least busy, at once (the first decision)
    # 3 s more: CPU 0 full though this process used 7% of it, CPU 1 10%: crowded, and CPU 1
    # has room
    placement._last = placement._last._replace(at=placement._last.at - 3.0)
    _write_proc(tmp_path, int(3.3 * ticks), int(1.2 * ticks), 6 * ticks, int(0.4 * ticks))
    placement._decide()
    assert placement.pinned == 1

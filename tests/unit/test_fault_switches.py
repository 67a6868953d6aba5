"""Fault switches never act silently: ``onceflow run`` refuses them, only the test-only
entry point reads them, and says so (issue 29, reproduction 8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from onceflow import faults
from onceflow.devtools.harness import fault_aware

# A config that fails to load: the normal CLI ran (and refused it) after the switches.
BROKEN = 'onceflow.pipeline = "onceflow.examples.robots:pipeline"\nonceflow.nope = 1\n'


def launch(tmp_path: Path, module: str, switches: dict[str, str]
           ) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "app.conf"
    conf.write_text(BROKEN)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")},
           **switches}
    return subprocess.run([sys.executable, "-m", module, "run", "-c", str(conf)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_production_worker_refuses_to_start_with_a_fault_switch_set(tmp_path: Path
                                                                         ) -> None:
    done = launch(tmp_path, "onceflow", {"ONCEFLOW_FAULT_NO_FENCING": "1"})
    assert done.returncode == 2, done.stderr
    assert "ONCEFLOW_FAULT_NO_FENCING set: fault switches are for tests only" in done.stderr
    assert "onceflow.nope" not in done.stderr  # refused before anything else


def test_the_fault_worker_warns_per_active_switch_then_runs_the_normal_cli(tmp_path: Path
                                                                            ) -> None:
    done = launch(tmp_path, "onceflow.devtools.fault_worker",
                  {"ONCEFLOW_FAULT_NO_FENCING": "1", "ONCEFLOW_FAULT_UPSTREAM_FIRST": ""})
    assert done.returncode == 2, done.stderr
    assert "WARNING onceflow.faults: fault switch active (test-only entry point): " \
           "ONCEFLOW_FAULT_NO_FENCING=1" in done.stderr
    assert "UPSTREAM_FIRST" not in done.stderr  # empty: off, and not refused either
    assert "onceflow.nope: unknown key" in done.stderr


def test_the_fault_worker_refuses_an_unknown_switch(tmp_path: Path) -> None:
    done = launch(tmp_path, "onceflow.devtools.fault_worker", {"ONCEFLOW_FAULT_NO_FENCE": "1"})
    assert done.returncode == 2
    assert "unknown fault switch ONCEFLOW_FAULT_NO_FENCE" in done.stderr


def test_importing_the_runtime_reads_no_switch() -> None:
    """The module's switches stay off whatever the environment holds: only ``configure``
    (the fault worker's) sets them."""
    code = ("from onceflow import faults; import onceflow.runtime.worker; "
            "print(faults.NO_FENCING, faults.KILL_AFTER_SAVE)")
    env = {**os.environ, "ONCEFLOW_FAULT_NO_FENCING": "1", "ONCEFLOW_FAULT_KILL_AFTER_SAVE": "x"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout
    assert out.strip() == "False None"


def test_the_harness_starts_workers_given_switches_through_the_fault_worker() -> None:
    argv = [sys.executable, "-m", "onceflow", "run", "-c", "app.conf"]
    assert fault_aware(argv, {"PATH": "/bin"}) == argv
    assert fault_aware(argv, {"ONCEFLOW_FAULT_KILL_AFTER_SENDS": "3"})[1:4] == \
        ["-m", "onceflow.devtools.fault_worker", "run"]
    assert faults.set_in({"ONCEFLOW_FAULT_X": "", "ONCEFLOW_OTHER": "1"}) == ["ONCEFLOW_FAULT_X"]

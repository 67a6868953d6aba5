"""``onceflow new NAME``: a starter project, the README's quickstart, written to ``./NAME``.

A pipeline module over a plain JSON topic (per-merchant totals, producer
re-sends dropped), a config for the local services, a ``TestRun`` test and two
scripts (create the topics, send sample payments). The files are the templates
in ``onceflow/runtime/starter/`` with ``{{name}}`` replaced; the README shows
what ``onceflow new payments`` writes, and tests/unit/test_readme_quickstart.py
fails when the two differ, so the quickstart cannot drift from the command.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from importlib import resources
from importlib.machinery import PathFinder
from pathlib import Path

__all__ = ["FILES", "NewProjectError", "cli", "name_problem", "next_steps", "render", "write"]

EXIT_OK, EXIT_USAGE = 0, 2
PLACEHOLDER = "{{name}}"
# Project path (with {{name}}) -> template in onceflow/runtime/starter ("": an empty file).
FILES: dict[str, str] = {
    "{{name}}/__init__.py": "",
    "{{name}}/pipeline.py": "pipeline.py.tmpl",
    "tests/test_pipeline.py": "test_pipeline.py.tmpl",
    "{{name}}.conf": "app.conf.tmpl",
    "create_topics.py": "create_topics.py.tmpl",
    "send_payments.py": "send_payments.py.tmpl",
}
# ASCII only: NAME is also the topic, the consumer group and the Redis key prefix, and a
# Kafka topic name allows only [a-zA-Z0-9._-] (at most 249 characters, with the suffix).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
_TAKEN = {"onceflow", "tests"}  # the project's own tests/ directory, and onceflow itself


class NewProjectError(Exception):
    """The project cannot be written (the message says why); the command exits 2."""


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be the project's package, topic and group; None if it can."""
    if not _NAME.fullmatch(name):
        return (f"{name!r} is not a Python package name: use letters, digits and _ "
                "(ASCII, not starting with a digit, at most 100), e.g. payments")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"{name!r} is a Python keyword: choose another name"
    if name in _TAKEN or name in sys.stdlib_module_names:
        return (f"{name!r} would shadow the module of that name when the worker imports your "
                "package from the project directory: choose another name")
    here = Path.cwd().resolve()
    elsewhere = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    spec = PathFinder.find_spec(name, elsewhere)
    if spec is not None:
        where = spec.origin or ", ".join(spec.submodule_search_locations or ())
        return (f"{name!r} is already an installed module ({where}); your package would "
                "shadow it when the worker imports from the project directory: choose "
                "another name")
    return None


def render(name: str) -> dict[str, str]:
    """Project path -> content, for the project ``name`` (not checked here)."""
    starter = resources.files("onceflow.runtime") / "starter"
    return {path.replace(PLACEHOLDER, name):
            (starter / template).read_text(encoding="utf-8").replace(PLACEHOLDER, name)
            if template else ""
            for path, template in FILES.items()}


def next_steps(name: str) -> str:
    """The commands that follow ``onceflow new NAME`` (printed, and shown in the README)."""
    steps = [
        (f"cd {name}", ""),
        ("pip install 'onceflow[embedded]' pytest", "the local services, and pytest"),
        ("python -m pytest tests", "the pipeline in memory, no broker"),
        ("onceflow services up --only kafka,redis", "a broker and Redis on their usual ports"),
        ("python create_topics.py", ""),
        (f"onceflow run -c {name}.conf", "until Ctrl-C: flushes, commits, exits 0"),
        (f"# then in a second shell, in {name}/:", ""),
        ("python send_payments.py", "1000 payments, about 50 of them sent twice"),
        (f"onceflow status -c {name}.conf --wait", "returns at lag 0: every record is counted"),
        (f"onceflow states -c {name}.conf per_merchant", "the totals, a JSON line per merchant"),
    ]
    width = max(len(command) for command, _ in steps) + 2
    return "".join(f"{command.ljust(width)}# {why}\n" if why else f"{command}\n"
                   for command, why in steps)


def write(name: str, parent: Path) -> Path:
    """Write the project ``parent/name``; NewProjectError if ``name`` is refused or the
    directory exists and is not empty (nothing is written then)."""
    problem = name_problem(name)
    if problem is not None:
        raise NewProjectError(problem)
    project = parent / name
    if project.exists() and not project.is_dir():
        raise NewProjectError(f"{project} exists and is not a directory")
    if project.is_dir() and any(project.iterdir()):
        raise NewProjectError(f"{project} exists and is not empty: nothing written; choose "
                              "another name or remove it")
    for path, content in render(name).items():
        target = project / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    return project


def cli(argv: list[str]) -> int:
    """``onceflow new NAME``: 0 when written, 2 when refused (with the reason)."""
    parser = argparse.ArgumentParser(
        prog="onceflow new",
        description="Write a starter project to ./NAME: a pipeline module over a plain JSON "
                    "topic NAME, its config, a TestRun test, scripts to create the topics "
                    "and send sample payments; then print the commands to run it.")
    parser.add_argument("name", metavar="NAME",
                        help="the package, topic, consumer group and Redis key prefix")
    args = parser.parse_args(argv)
    try:
        project = write(args.name, Path.cwd())
    except (NewProjectError, OSError) as error:
        print(f"onceflow new: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {project}: {', '.join(render(args.name))}\n\nNext:\n")
    print("    " + next_steps(args.name).rstrip("\n").replace("\n", "\n    "))
    return EXIT_OK

"""Writes docs/guide/configuration.md from onceflow/runtime/reference.conf.

Every key with its type, default, environment variable and the comment above
it (the why), so the reference cannot drift from the file the worker merges
under every config: tests/unit/test_config_reference.py fails when the
committed page differs from what this script writes.

    python scripts/config_reference.py           # rewrite the page
    python scripts/config_reference.py --check   # exit 1 if it is stale
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "onceflow" / "runtime" / "reference.conf"
TARGET = ROOT / "docs" / "guide" / "configuration.md"
COMMAND = "python scripts/config_reference.py"

_ASSIGN = re.compile(r"^(?P<key>[\w-]+)\s*=\s*(?P<value>.*?)\s*$")
_OPEN = re.compile(r"^(?P<key>[\w-]+)\s*\{\s*$")
_ENV = re.compile(r"^\$\{\?(\w+)\}$")
_DURATION = re.compile(r"^\d+(\.\d+)?(ns|us|ms|s|m|h|d)$")
_RANGE = re.compile(r"\((-?[\d.]+\w*\.\.[\d.]+\w*)[^)]*\)")


@dataclass
class Key:
    """One setting: its dotted path, default text, env variable and why."""

    path: str
    default: str
    why: str
    env: str = ""


@dataclass
class Section:
    """An object of the file: its path, its own comment, its keys in file order."""

    path: str
    why: str
    keys: list[Key] = field(default_factory=list)


def parse(text: str) -> tuple[str, list[Section]]:
    """The file's header comment and its sections, each key once (later lines win)."""
    header: list[str] = []
    pending: list[str] = []
    stack: list[str] = []
    sections: list[Section] = []
    by_path: dict[str, Key] = {}
    last: Key | None = None  # the previous key, while no blank line or comment came between
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            if not stack and pending:
                header, pending = header + pending + [""], []
            pending, last = [], None
            continue
        if line.startswith("#"):
            comment = line[1:]
            pending.append(comment[1:] if comment.startswith(" ") else comment)
            last = None
            continue
        if line == "}":
            stack.pop()
            pending, last = [], None
            continue
        opened = _OPEN.match(line)
        if opened:
            if not stack:
                header, pending = header + pending, []
            stack.append(opened["key"])
            sections.append(Section(".".join(stack), _join(pending)))
            pending, last = [], None
            continue
        assigned = _ASSIGN.match(line)
        if not assigned:
            raise ValueError(f"reference.conf: cannot read line {raw!r}")
        path = ".".join([*stack, assigned["key"]])
        value = assigned["value"]
        env = _ENV.match(value)
        key = by_path.get(path)
        if key is None:
            owner = next(s for s in reversed(sections) if s.path == ".".join(stack))
            # A key without a comment of its own shares the one of the key right above it
            # (cert-file, key-file), else its object's.
            why = _join(pending) if pending else (last.why if last else owner.why)
            key = by_path[path] = Key(path, "", why)
            owner.keys.append(key)
        if env:
            key.env = env[1]
        else:
            key.default = value
        pending, last = [], key
    return "\n".join(header).strip(), [s for s in sections if s.keys]


def _join(comment: list[str]) -> str:
    return " ".join(line.strip() for line in comment)


def kind(key: Key) -> str:
    """The type a reader of the page should give, told by the default (and the name for null)."""
    value, name = key.default, key.path.rsplit(".", 1)[-1]
    if value in ("true", "false"):
        found = "boolean"
    elif re.fullmatch(r"-?\d+", value):
        found = "integer"
    elif re.fullmatch(r"-?\d+\.\d+", value):
        found = "number"
    elif _DURATION.match(value):
        found = "duration"
    elif value.startswith("["):
        found = "list of strings"
    elif value == "null":
        found = ("path" if name.endswith("-file") or name == "dir"
                 else "object" if name in ("conf", "datacenters", "pipeline-settings")
                 else "string")
        found += " or null"
    elif re.fullmatch(r'"\d+[kmgt]"', value):
        found = "memory size"
    else:
        found = "string"
    bounds = _RANGE.search(key.why)
    return f"{found} ({bounds[1]})" if bounds and found != "string" else found


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(text: str) -> str:
    """The Markdown page for the text of reference.conf."""
    header, sections = parse(text)
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from onceflow/runtime/reference.conf by scripts/config_reference.py:",
        f"     do not edit; run `{COMMAND}` after changing reference.conf. -->",
        "",
        "Every key of [`reference.conf`](../../onceflow/runtime/reference.conf), the file",
        "your `app.conf` is merged over: its type, its default, the environment",
        "variable that sets it (if any) and why it is there. From the file's header:",
        "",
        "```text",
        header,
        "```",
    ]
    for section in sections:
        out += ["", f"## `{section.path}`", ""]
        if section.why:
            out += [section.why, ""]
        out += ["| Key | Type | Default | Environment | Why |", "|---|---|---|---|---|"]
        for key in section.keys:
            name = key.path.rsplit(".", 1)[-1]
            env = f"`{key.env}`" if key.env else ""
            out.append(f"| `{name}` | {kind(key)} | `{_cell(key.default)}` | {env} "
                       f"| {_cell(key.why)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    page = render(SOURCE.read_text())
    if argv[1:] == ["--check"]:
        if TARGET.exists() and TARGET.read_text() == page:
            return 0
        print(f"{TARGET.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1
    TARGET.write_text(page)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Where the user's pipeline module is imported from.

``onceflow run -c app.conf`` names ``payapp.pipeline:pipeline``; the console
script, unlike ``python -m``, does not put the current directory on the
import path, so a project's own module was not found unless ``PYTHONPATH``
said so. The command now does what ``python -m`` does: the current directory
comes first on the path, or the directory given with ``--app-dir`` (as
uvicorn and gunicorn's ``--chdir`` let you choose it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["app_dir", "import_hint", "take_app_dir", "use_app_dir"]

_FLAG = "--app-dir"
_chosen: list[Path] = []  # the directory in use, once the command chose it


def take_app_dir(argv: list[str]) -> tuple[list[str], Path]:
    """``argv`` without ``--app-dir DIR`` (or ``--app-dir=DIR``, anywhere), and the
    directory: that one, else the current directory. ValueError if DIR is missing."""
    rest: list[str] = []
    chosen: str | None = None
    args = iter(argv)
    for arg in args:
        if arg == _FLAG:
            chosen = next(args, None)
            if chosen is None:
                raise ValueError(f"{_FLAG} expects a directory")
        elif arg.startswith(f"{_FLAG}="):
            chosen = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    directory = Path(chosen) if chosen is not None else Path.cwd()
    if chosen is not None and not directory.is_dir():
        raise ValueError(f"{_FLAG}: expected a directory, {chosen!r} is not one")
    return rest, directory.resolve()


def use_app_dir(directory: Path) -> None:
    """Put ``directory`` first on the import path (once)."""
    entry = str(directory)
    if entry in sys.path:
        sys.path.remove(entry)
    sys.path.insert(0, entry)
    _chosen[:] = [directory]


def app_dir() -> Path | None:
    """The directory the command put on the path, if it did (None in a library use)."""
    return _chosen[0] if _chosen else None


def import_hint(module_name: str, error: BaseException) -> str:
    """For a pipeline module that is not found: where it was looked for, and the fix."""
    top = module_name.split(".", 1)[0]
    if not isinstance(error, ModuleNotFoundError) or error.name not in (top, module_name):
        return ""
    where = app_dir()
    searched = f"{where} (the app directory)" if where else "the import path"
    return (f"; looked in {searched} and the installed packages: run onceflow from the "
            f"directory that holds {top}{os.sep} or {top}.py, pass {_FLAG} DIR, or install "
            f"your package into this environment")

"""reference.conf parsed once per install, not once per process.

pyhocon takes about 0.7 s of CPU to parse the 500-line reference.conf: most of a
worker's start-up, paid again by every restart after a crash and by every CLI command.
The parsed tree is kept as a pickle in the package's ``__pycache__`` (as Python keeps
bytecode, and under the same rules: ``PYTHONPYCACHEPREFIX``, ``PYTHONDONTWRITEBYTECODE``),
named by a hash of the text, pyhocon's module and Python's version, so an edited file or
another library never meets a stale tree; unpickling takes about 2 ms. Where the folder
cannot be written the text is parsed each time, as before.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
from pathlib import Path

import pyhocon.config_tree
from pyhocon import ConfigFactory, ConfigTree

REFERENCE = Path(__file__).with_name("reference.conf")


def parse_reference(path: Path = REFERENCE) -> ConfigTree:
    """The tree of ``path`` (unresolved: ``${?VAR}`` kept), from the cache when it holds it."""
    text = path.read_text("utf-8")
    cached = _cache_file(path, text)
    try:
        tree = pickle.loads(cached.read_bytes())
        if isinstance(tree, ConfigTree):
            return tree
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError,
            IndexError, TypeError, ValueError):
        pass  # not cached yet, or written by a run that died half-way: parse it
    tree = ConfigFactory.parse_string(text, resolve=False)
    _store(cached, tree)
    return tree


def _cache_file(path: Path, text: str) -> Path:
    library = os.stat(pyhocon.config_tree.__file__)  # another pyhocon, another tree
    version = f"{text}\0{library.st_size}:{library.st_mtime_ns}\0{sys.version}".encode()
    digest = hashlib.sha256(version).hexdigest()[:20]
    folder = path.resolve().parent
    if sys.pycache_prefix:  # where this Python keeps bytecode (PYTHONPYCACHEPREFIX)
        cache = Path(sys.pycache_prefix, *folder.parts[1:])
    else:
        cache = folder / "__pycache__"
    return cache / f"{path.name}.{digest}.pickle"


def _store(cached: Path, tree: ConfigTree) -> None:
    """Write the pickle atomically (a concurrent start reads the whole file or none);
    not where Python is told to write no bytecode (PYTHONDONTWRITEBYTECODE)."""
    if sys.dont_write_bytecode:
        return
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cached.parent, delete=False) as out:
            out.write(pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        return  # a read-only install: parse at each start
    try:
        os.replace(out.name, cached)
    except OSError:
        Path(out.name).unlink(missing_ok=True)

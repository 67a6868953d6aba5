"""Build the wheel into ``dist/`` with the record path compiled by mypyc and unpack its
compiled modules in place (``make setup``), or ``--remove`` them (``make pure``).

Loads ``onceflow/compiled.py`` by its path: importing the package would run the
stale-build check this command exists to fix.
"""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "onceflow_compiled", Path(__file__).resolve().parent.parent / "onceflow" / "compiled.py")
assert spec is not None and spec.loader is not None
compiled = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compiled)
compiled.main(sys.argv[1:])

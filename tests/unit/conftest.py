"""Unit tests share small builders (``from test_runner import ...``)."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.runtime import app_path

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _import_path_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (``cli.main``) puts its app directory on the
    import path and remembers it; undo both, so no later test in the process sees them."""
    path, chosen = list(sys.path), list(app_path._chosen)
    yield
    sys.path[:] = path
    app_path._chosen[:] = chosen

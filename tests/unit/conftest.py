"""Unit tests share small builders (``from test_runner import ...``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

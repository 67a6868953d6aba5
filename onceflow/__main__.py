"""``python -m onceflow`` is the ``onceflow`` command."""

import sys

from onceflow.runtime.cli import main

sys.exit(main())

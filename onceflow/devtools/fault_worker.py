"""The test harness's worker: ``onceflow`` with the ``ONCEFLOW_FAULT_*`` switches read.

``python -m onceflow.devtools.fault_worker run -c app.conf ...`` reads the
fault switches (``onceflow.faults``) from the environment, logs a
WARNING per active one, removes them from the environment (the production
``onceflow run`` refuses to start while one is set) and runs the normal
command line. Never in a deployment: the production entry point has no way
to turn a guarantee off.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from onceflow import faults
from onceflow.runtime import cli

log = logging.getLogger("onceflow.faults")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(  # as cli.main does (a no-op there then)
        level=logging.DEBUG if argv[:1] in (["-v"], ["--verbose"]) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        active = faults.configure(os.environ)
    except (faults.UnknownSwitch, ValueError) as error:
        print(f"onceflow: fault worker: {error}", file=sys.stderr)
        return cli.EXIT_CONFIG
    for name in faults.set_in(os.environ):
        del os.environ[name]
    for name, value in sorted(active.items()):
        log.warning("fault switch active (test-only entry point): %s=%s", name, value)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())

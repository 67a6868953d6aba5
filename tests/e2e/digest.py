"""What a failed e2e assertion prints: a short digest of the workers' logs.

CI keeps only the end of a failure's output, never the temporary directory,
so a failing comparison says what the workers saw: each log's last stats
line and its warnings and errors (the first few of each kind).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

_NOTABLE = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback|hole at|re-fetching")
_NUMBERS = re.compile(r"\d+")


def log_digest(logs: Iterable[Path], per_kind: int = 2) -> str:
    lines = []
    for log in logs:
        text = log.read_text(errors="replace").splitlines() if log.exists() else []
        stats = [line for line in text if "pipeline_actor: stats" in line]
        lines.append(f"== {log.name}: {len(text)} lines; last stats: "
                     f"{stats[-1].split('stats ', 1)[-1] if stats else None}")
        seen: Counter[str] = Counter()
        for line in text:
            if _NOTABLE.search(line):
                kind = _NUMBERS.sub("#", line[24:])[:80]  # without the timestamp and numbers
                seen[kind] += 1
                if seen[kind] <= per_kind:
                    lines.append("   " + line[:300])
        repeated = {kind: n for kind, n in seen.items() if n > per_kind}
        if repeated:
            lines.append(f"   (and {sum(repeated.values()) - per_kind * len(repeated)} more "
                         f"of {len(repeated)} kinds)")
    return "\n".join(lines)


def window_diff(found: Mapping[object, Counter[str]], truth: Mapping[object, Counter[str]]
                ) -> str:
    """Totals and the first differing windows, short (CI shows only the end)."""
    wrong = [k for k in truth.keys() | found.keys() if found.get(k) != truth.get(k)]
    total_found = sum((sum(c.values()) for c in found.values()), 0)
    total_truth = sum((sum(c.values()) for c in truth.values()), 0)
    sample = "; ".join(f"{k}: {dict(found.get(k) or {})} != {dict(truth.get(k) or {})}"
                       for k in sorted(wrong, key=str)[:4])
    return (f"{len(wrong)} of {len(truth)} windows wrong; events found {total_found}, "
            f"truth {total_truth}; e.g. {sample}")

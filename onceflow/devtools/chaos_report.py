"""What a chaos run found (``ChaosReport``: counts, verdict, timeline and names) and its
table for the console, apart from the run that fills it (``chaos``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.table import Table

from onceflow.devtools.chaos_truth import LateEvents
from onceflow.devtools.tables import measures


@dataclass
class ChaosReport:
    messages: int = 0
    events: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    pauses: dict[str, list[float]] = field(default_factory=dict)  # seconds frozen, each
    resends: int = 0  # reports the robots sent twice
    producer_duplicates: int = 0  # re-sends the republisher dropped (its dedup tables)
    duplicates: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)  # events in the late-events topic
    late_twice: int = 0  # late events written twice, or matching no input event
    late_events: LateEvents = field(default_factory=dict, repr=False)
    windows: dict[str, int] = field(default_factory=dict)  # windows checked per stage
    closed: dict[str, int] = field(default_factory=dict)  # of them closed (history rows)
    mismatched: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    double: int = 0
    caught_up: bool = False
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    normalized: int = 0  # records in the normalized topic (units hold several events)
    normalized_once: int = 0  # of them distinct (by source chain), holding events:
    normalized_events: int = 0
    elapsed: float = 0.0  # from the start (stream generation) to the end of the check
    # Wall-clock moments (time.time()) of the phases, for benchmarks: workers started,
    # input produced (and kills done), republisher / aggregator committed.
    timeline: dict[str, float] = field(default_factory=dict)
    #: The run's names, for a caller that reads on (``onceflow reconcile`` in its test):
    #: topics "raw", "normalized", "late", "dead"; groups "republisher", "aggregator".
    topics: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return (self.caught_up and self.lost == 0 and self.double == 0 and not self.late_twice
                and self.producer_duplicates == self.resends and not any(self.mismatched.values())
                and all(code == 0 for code in self.exit_codes.values()))


def report_table(report: ChaosReport) -> Table:
    faults = "SIGKILL and SIGSTOP" if report.pauses else "SIGKILL"
    return measures(f"onceflow chaos: republisher + windowed aggregator under {faults}", [
        ("reports produced (without re-sends)", f"{report.messages:,}"),
        ("fastening events", f"{report.events:,}"),
        ("normalized records: written / distinct / events in them",
         f"{report.normalized:,} / {report.normalized_once:,} / {report.normalized_events:,}"),
        ("re-sent reports / dropped by (serial, seq)",
         f"{report.resends:,} / {report.producer_duplicates:,}"),
        *[(f"SIGKILLs: {name}", str(n)) for name, n in report.kills.items()],
        *[(f"SIGSTOPs: {name}", ", ".join(f"{s:.1f} s" for s in frozen))
          for name, frozen in report.pauses.items()],
        *[(f"duplicates discarded: {s}", f"{n:,}") for s, n in report.duplicates.items()],
        *[(f"late events routed: {s}", f"{n:,}") for s, n in report.late.items()],
        ("late events twice or unmatched", str(report.late_twice)),
        *[(f"windows checked: {s}", f"{n:,}") for s, n in report.windows.items()],
        *[(f"windows wrong: {s}", str(n)) for s, n in report.mismatched.items()],
        ("lost", f"{report.lost:,}"),
        ("double", f"{report.double:,}"),
        ("exit codes after SIGTERM", str(report.exit_codes)),
        ("elapsed", f"{report.elapsed:.1f} s"),
    ])

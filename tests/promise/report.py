"""What a run prints at its end: the statistics, the notes, every violation, the replay command."""

from __future__ import annotations

from collections import Counter

from tests.promise.run import Outcome

# Past this many violations of one invariant, the rest are printed without their evidence.
DETAILED_PER_INVARIANT = 5


def report(outcome: Outcome) -> list[str]:
    violations = outcome.findings.violations
    lines = [f"promise checker: seed {outcome.seed} ran in {outcome.seconds:.0f} s"]
    lines += [f"  {line}" for line in outcome.stats]
    lines += [f"  note: {note}" for note in outcome.findings.notes]
    shown: Counter[int] = Counter()
    for violation in violations:
        shown[violation.invariant] += 1
        detailed = violation.lines()
        if shown[violation.invariant] > DETAILED_PER_INVARIANT:
            detailed = [line for line in detailed if not line.startswith("    ")]
        lines += detailed
    lines += [f"ANOMALY {text}" for text in outcome.anomalies]
    if outcome.failed:
        by_invariant = ", ".join(f"{n} of {i}" for i, n in sorted(shown.items()))
        lines.append(
            f"promise checker: seed {outcome.seed}: {len(violations)} violation(s)"
            + (f" (by invariant: {by_invariant})" if violations else "")
            + f", {len(outcome.anomalies)} anomaly(ies)"
        )
        lines.append(f"  replay: {outcome.replay}")
        lines.append(f"  run folder: {outcome.folder}")
    else:
        lines.append(f"promise checker: seed {outcome.seed}: no violation")
    return lines

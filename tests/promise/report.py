"""What a run prints at its end: the statistics, the notes, every violation, the replay command."""

from __future__ import annotations

from tests.promise.run import Outcome


def report(outcome: Outcome) -> list[str]:
    violations = outcome.findings.violations
    lines = [f"promise checker: seed {outcome.seed} ran in {outcome.seconds:.0f} s"]
    lines += [f"  {line}" for line in outcome.stats]
    lines += [f"  note: {note}" for note in outcome.findings.notes]
    for violation in violations:
        lines += violation.lines()
    lines += [f"ANOMALY {text}" for text in outcome.anomalies]
    if outcome.failed:
        by_invariant = sorted({v.invariant for v in violations})
        lines.append(
            f"promise checker: seed {outcome.seed}: {len(violations)} violation(s)"
            + (f" of invariant(s) {', '.join(map(str, by_invariant))}" if violations else "")
            + f", {len(outcome.anomalies)} anomaly(ies)"
        )
        lines.append(f"  replay: {outcome.replay}")
        lines.append(f"  run folder: {outcome.folder}")
    else:
        lines.append(f"promise checker: seed {outcome.seed}: no violation")
    return lines

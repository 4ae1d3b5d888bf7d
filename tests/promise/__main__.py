"""`python -m tests.promise --seed S --minutes M [--workers N]`: a longer run, or a replay.

Exits 1 when an invariant was violated or the run met an anomaly, 0 otherwise.
`--short` runs the suite's short profile (what `test_promise_short.py` runs) with the
given seed.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
from pathlib import Path

from tests.promise.profiles import SHORT, for_minutes
from tests.promise.report import report
from tests.promise.run import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.promise", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--minutes", type=float, default=2.0, help="minutes of faults")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--short", action="store_true", help="the suite's short profile")
    parser.add_argument("--keep", action="store_true", help="keep the run folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # The API runs in this process: its warnings while the database restarts are expected.
    logging.getLogger("orquestador").setLevel(logging.ERROR)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    profile = SHORT if args.short else for_minutes(args.minutes, args.workers)
    folder = Path(tempfile.mkdtemp(prefix="orquestador-promise-"))
    outcome = run(seed, profile, folder, say=lambda line: print(line, flush=True))
    for line in report(outcome):
        print(line, flush=True)
    if not (args.keep or outcome.failed):
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if outcome.failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the worker's CPU goes: py-spy over one benchmark drain, summed by protocol step.

    python benchmarks/worker_profile.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        -n 8000 --py-spy PATH/TO/py-spy

Runs py-spy (`record --subprocesses --nonblocking --gil -r 200 -f raw`) over
throughput.py draining an N-execution backlog (one action, one worker process,
concurrency 10, no baselines, no idle run), keeps the samples of the worker process
(`orquestador.worker`) taken while a thread held the GIL, and prints the inclusive share
of each step: a sample counts for a step when any frame of its stack is in that step.
py-spy is not a dependency of the project: install it where you like (`pip install
py-spy` into any environment) and pass its path, or have it on PATH.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (step, pattern over "function (file)" frames); a sample can count for several steps.
STEPS = [
    # One execution at a time (before the protocol writer, and off its path after it).
    ("finish (finish_execution: pipelined locks and complete, COMMIT)", r"finish_execution "),
    ("RUNNING checkpoint (start_checkpoint)", r"start_checkpoint "),
    ("SUCCEEDED checkpoint (succeed_checkpoint)", r"succeed_checkpoint "),
    (
        "protocol writer thread (worker/protocol_writer.py, queue/batches.py)",
        r"\(orquestador/(worker/protocol_writer|queue/batches)\.py:",
    ),
    ("claim (Scheduler.claim_once, handing claims to threads)", r"claim_once "),
    ("adapter call hand-off (AdapterCalls, call thread)", r"\(orquestador/worker/calls\.py:"),
    ("request data validated (validate_request_data)", r"validate_request_data "),
    ("decision, updates, mapping", r"(decide_destination|compute_updates|apply_updates) "),
    ("input resolution, hashing, adapter schema checks", r"(resolve_inputs|input_hash|problems) "),
    ("SQLAlchemy connection checkout and return", r"\(sqlalchemy/pool/"),
    ("psycopg: send, wait, read results", r"\(psycopg/"),
    ("logging", r"\(logging/"),
    ("imports at start-up", r"_find_and_load "),
    ("a job in all (_ExecutionRun.run, everything above but the claim)", r"_ExecutionRun\.run "),
    ("heartbeat and listener threads", r"\(orquestador/worker/(heartbeat|listener)\.py:"),
]


def find_py_spy(given: str) -> str:
    found = given or shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy not found: pip install py-spy somewhere and pass --py-spy")
    return found


def summarize(raw: Path) -> tuple[int, Counter[str]]:
    """Samples of the worker process, and how many of them each step appears in."""
    total, steps = 0, Counter()
    patterns = [(name, re.compile(pattern)) for name, pattern in STEPS]
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        # py-spy names each process in a frame of its own: the benchmark, then its child.
        if '-m orquestador.worker"' not in stack:
            continue
        samples = int(count)
        total += samples
        for name, pattern in patterns:
            if pattern.search(stack):
                steps[name] += samples
    return total, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("-n", type=int, default=8_000)
    parser.add_argument("--py-spy", default="")
    parser.add_argument("--raw", default="", help="keep py-spy's raw output here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        raw = Path(args.raw) if args.raw else Path(folder) / "worker.raw"
        command = [
            find_py_spy(args.py_spy),
            "record",
            "--subprocesses",
            "--nonblocking",
            "--gil",
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            str(raw),
            "--",
            sys.executable,
            str(HERE / "throughput.py"),
            "--dsn",
            args.dsn,
            "-n",
            str(args.n),
            "--actions",
            "1",
            "--processes",
            "1",
            "--skip-same-protocol",
            "--reference-dir",
            "",
            "--idle-count",
            "0",
        ]
        print(shlex.join(command), flush=True)
        subprocess.run(command, check=True)
        total, steps = summarize(raw)
    print()
    print(f"{total} samples of the worker process holding the GIL (inclusive shares)")
    print("| step | share |")
    print("|---|---|")
    for name, _ in STEPS:
        print(f"| {name} | {steps[name] / max(total, 1):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

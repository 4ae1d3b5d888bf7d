"""The engine `orquestador flows test` plays cases on: the real one, thrown away after.

A database of its own (an embedded server in a temporary folder, or a new database on
the server DATABASE_URL names, dropped afterwards), migrated; the API (on a loopback port,
called through the Python client) and a worker in this process, with the adapters and
integrations the settings configure. The flow is
published there and every case is a dry run, so nothing outside is called for a step
that writes, and the author's own database never sees the flow or the runs.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, pool, text

from orquestador.authoring.cases import Case, Ended, Played
from orquestador.client import ApiError, Client
from orquestador.config import Settings, sqlalchemy_url
from orquestador.db import migrate
from orquestador.domain.statuses import UNFINISHED, ExecutionStatus
from orquestador.errors import OrquestadorError

# Statuses a dry run still moves on from.
ORG = "flows-test"
AUTHOR = "flows-test"
SCOPES = ["flows:admin", "requests:read", "requests:write"]


class EngineUnavailable(OrquestadorError):
    """No database to rehearse on could be made."""


class RehearsalEngine:
    """Publishes a flow and plays cases on it through the API, as an author would."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def publish(self, definition: Any) -> tuple[str | None, list[str]]:
        """(the flow version's id, []) or (None, what publishing refused, one per line)."""
        try:
            return self._client.publish_flow(definition)["id"], []
        except ApiError as refusal:
            problems = (refusal.problem or {}).get("problems") or []
            lines = [f"{p.get('path') or '/'}: {p.get('message')}" for p in problems]
            return None, lines or [refusal.detail or str(refusal)]

    def play(self, flow_id: str, cases: Sequence[Case], timeout: float) -> list[Played]:
        """Start every case's dry run, then wait for each to end (at most `timeout` each)."""
        started: list[tuple[Case, str | None, str | None, float]] = []
        for case in cases:
            try:
                accepted = self._client.start_dry_run(
                    flow_id, case.transition, case.data, state=case.state, outcomes=case.outcomes
                )
            except ApiError as refusal:
                started.append((case, None, _refused(refusal), 0.0))
            else:
                started.append((case, accepted["executionId"], None, time.monotonic()))
        return [
            self._ended(case, execution_id, began, timeout)
            if execution_id is not None
            else Played(case, problem=problem)
            for case, execution_id, problem, began in started
        ]

    def _ended(self, case: Case, execution_id: str, began: float, timeout: float) -> Played:
        """The case's run to its end: the dry run, and each one its states continue into."""
        deadline = began + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            execution = self._client.wait_execution(execution_id, left)
            if execution["status"] == ExecutionStatus.SUCCEEDED and execution.get("continuedBy"):
                execution_id = execution["continuedBy"]
                continue
            if execution["status"] not in UNFINISHED:
                break
            return Played(
                case,
                problem=f"still {execution['status']} after {timeout:g} s",
                execution_id=execution_id,
                seconds=time.monotonic() - began,
            )
        request = self._client.get_request(execution["requestId"])
        return Played(
            case,
            Ended.of(execution, request),
            execution_id=execution_id,
            seconds=time.monotonic() - began,
        )


def _refused(refusal: ApiError) -> str:
    words = f"the dry run was refused: {refusal.code or refusal.status}"
    for problem in (refusal.problem or {}).get("problems") or []:
        words += f"; {problem.get('path') or '/'}: {problem.get('message')}"
    return words


@contextmanager
def rehearsal_engine(settings: Settings) -> Iterator[RehearsalEngine]:
    """The engine, up until the block ends; everything it made is gone after."""
    from orquestador.api.app import create_app
    from orquestador.api.context import EXTENSION_KEY
    from orquestador.api.tokens import mint_token
    from orquestador.serve import serve_in_thread
    from orquestador.worker.daemon import build_worker

    with _throwaway_database(settings) as url:
        owner = sqlalchemy_url(url).username
        migrate.upgrade(migrate.alembic_config(url=url, runtime_role=owner))
        local = settings.with_overrides(
            database_url=url,
            migration_database_url=url,
            listen_database_url="",
            jwt_secret=secrets.token_urlsafe(32),
            worker_id="flows-test",
            worker_metrics_port="",
            worker_poll_ms=50,
            worker_enabled=True,
            request_api_enabled=True,
            flow_admin_enabled=True,
        )
        app = create_app(local)
        # The API on a loopback port of its own, for this process's client only.
        server, thread = serve_in_thread(app, "127.0.0.1", 0, access_log=False)
        worker = build_worker(local)
        worker.start()
        token = mint_token(local, sub=AUTHOR, org=ORG, scopes=SCOPES)
        client = Client(f"http://127.0.0.1:{server.server_port}", token)
        try:
            yield RehearsalEngine(client)
        finally:
            client.close()
            worker.stop(local.worker_drain_seconds + 5)
            worker.engine.dispose()
            server.shutdown()
            thread.join(10)
            app.extensions[EXTENSION_KEY].engine.dispose()


@contextmanager
def _throwaway_database(settings: Settings) -> Iterator[str]:
    """The URL of a database nobody else uses, as its owner; gone when the block ends."""
    given = settings.migration_database_url or settings.database_url
    if given:
        named = "MIGRATION_DATABASE_URL" if settings.migration_database_url else "DATABASE_URL"
        with _database_on(given, named) as url:
            yield url
        return
    from orquestador.db.embedded import EmbeddedPostgres, throwaway_folder

    folder = throwaway_folder("orquestador-flows-test-")
    server = EmbeddedPostgres(folder / "pgdata", fsync=False)
    try:
        server.start()
        yield server.url("postgres")
    finally:
        server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _database_on(url: str, named: str) -> Iterator[str]:
    name = f"orquestador_flows_test_{secrets.token_hex(6)}"
    admin = create_engine(
        sqlalchemy_url(url), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT"
    )
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:
        admin.dispose()
        raise EngineUnavailable(
            f"cannot create a throwaway database on the server of {named} "
            f"({type(error).__name__}: {str(error).splitlines()[0]}); the flows test needs a "
            "role that may CREATE DATABASE, or no DATABASE_URL (an embedded server)"
        ) from None
    try:
        yield sqlalchemy_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

"""The command bell's lost connection: quiet when the process stops, a warning otherwise."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, make_url, text

from orquestador.machines.bell import CommandBell

BELL_LOGGER = "orquestador.machines.bell"


class _Warned(logging.Handler):
    """Sets an event at the bell's first warning, so a test waits for it, not for a time."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


@pytest.fixture
def warned() -> Iterator[threading.Event]:
    handler = _Warned()
    logger = logging.getLogger(BELL_LOGGER)
    logger.addHandler(handler)
    try:
        yield handler.event
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def bell(database) -> Iterator[CommandBell]:
    url = make_url(database.runtime_dsn).set(drivername="postgresql")
    bell = CommandBell(url.render_as_string(hide_password=False), idle_seconds=60)
    yield bell
    # Stopping, so the test database's drop ends a still-listening thread quietly.
    bell.stop_polls()


def _drop_bell_connection(owner_engine: Engine) -> int:
    """What stopping the database does to the bell: its backend is terminated (57P01)."""
    with owner_engine.begin() as conn:
        return len(
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'orquestador-command-bell' "
                    "AND datname = current_database()"
                )
            ).all()
        )


def test_a_stopping_process_loses_the_bell_connection_without_a_warning(
    bell: CommandBell,
    owner_engine: Engine,
    caplog: pytest.LogCaptureFixture,
    warned: threading.Event,
) -> None:
    caplog.set_level(logging.DEBUG, logger=BELL_LOGGER)
    with bell.subscription("acme", "m-1"):
        assert bell.listening.wait(10)
        thread = bell._thread
        assert thread is not None
        # The order of a clean stop: the process ends its polls, then the database goes.
        bell.stop_polls()
        assert _drop_bell_connection(owner_engine) == 1
        thread.join(10)

        assert not thread.is_alive(), "a stopping bell does not reconnect"
        assert not bell.running
    bell_records = [r for r in caplog.records if r.name == BELL_LOGGER]
    assert [r.levelno for r in bell_records] == [logging.DEBUG]
    assert "closed while stopping" in bell_records[0].getMessage()
    assert not warned.is_set()


def test_a_lost_connection_while_running_is_a_warning_and_the_bell_listens_again(
    bell: CommandBell,
    owner_engine: Engine,
    caplog: pytest.LogCaptureFixture,
    warned: threading.Event,
) -> None:
    with bell.subscription("acme", "m-1"):
        assert bell.listening.wait(10)
        assert _drop_bell_connection(owner_engine) == 1

        assert warned.wait(10)
        assert bell.listening.wait(10)
        assert bell.running
    assert any(
        r.name == BELL_LOGGER
        and r.levelno == logging.WARNING
        and "command bell disconnected" in r.getMessage()
        for r in caplog.records
    )

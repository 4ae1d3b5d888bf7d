"""Log lines name what they are about (the record's extra, the exception) and carry no colours."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from pathlib import Path

from orquestador.logs import TextFormatter


def _file_logger(
    path: Path, formatter: logging.Formatter
) -> tuple[logging.Logger, logging.Handler]:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"orquestador.worker.test.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    return logger, handler


def test_a_worker_line_carries_its_extra_keys_and_the_exception(tmp_path: Path) -> None:
    execution_id = str(uuid.uuid4())
    logger, handler = _file_logger(tmp_path / "worker.log", TextFormatter())
    try:
        raise TimeoutError("read timed out\nsecond line with input values")
    except TimeoutError:
        logger.warning(
            "action outcome uncertain: %s",
            "TimeoutError",
            extra={
                "execution_id": execution_id,
                "request_id": "r-1",
                "action_id": "send",
                "capability": "http.call",
                "token": 7,
                "error_code": "ADAPTER_TIMEOUT",
                "worker_id": "host:12:ab",
            },
            exc_info=True,
        )
    handler.close()
    lines = (tmp_path / "worker.log").read_text().splitlines()
    assert len(lines) == 1, "an expected failure at WARNING is one line, no traceback"
    line = lines[0]
    assert " WARNING orquestador.worker.test." in line
    assert "action outcome uncertain: TimeoutError" in line
    for pair in (
        f"execution_id={execution_id}",
        "request_id=r-1",
        "action_id=send",
        "capability=http.call",
        "token=7",
        "error_code=ADAPTER_TIMEOUT",
        "worker_id=host:12:ab",
        "exception=TimeoutError",
        'exception_message="read timed out"',
    ):
        assert pair in line
    assert "input values" not in line


def test_an_error_keeps_its_traceback_after_the_line(tmp_path: Path) -> None:
    logger, handler = _file_logger(tmp_path / "api.log", TextFormatter())
    try:
        raise KeyError("flow")
    except KeyError:
        logger.exception("unhandled KeyError while serving a request", extra={"route": "/x y"})
    handler.close()
    first, *rest = (tmp_path / "api.log").read_text().splitlines()
    assert first.endswith('route="/x y" exception=KeyError exception_message="\'flow\'"')
    assert rest[0] == "Traceback (most recent call last):"


def test_colour_codes_never_reach_a_file(tmp_path: Path) -> None:
    logger, handler = _file_logger(tmp_path / "dev.log", TextFormatter())
    # What werkzeug's development server logs for a 404.
    logger.info('"%s" %s %s', "\x1b[33mGET /api/v1/requests/x HTTP/1.1\x1b[0m", "404", "-")
    handler.close()
    text = (tmp_path / "dev.log").read_bytes()
    assert b"\x1b" not in text
    assert b'"GET /api/v1/requests/x HTTP/1.1" 404 -' in text


def test_the_process_logging_setup_writes_no_escape_bytes_to_a_file(tmp_path: Path) -> None:
    script = (
        "import logging\n"
        "from orquestador.logs import configure\n"
        "configure('INFO')\n"
        "logging.getLogger('werkzeug').info('\\x1b[1m\\x1b[31mPOST /x\\x1b[0m 400')\n"
        "logging.getLogger('orquestador.worker.executor').info("
        "'execution succeeded', extra={'execution_id': 'e-1', 'token': 3})\n"
    )
    log_file = tmp_path / "stderr.log"
    with log_file.open("wb") as stderr:
        subprocess.run([sys.executable, "-c", script], stderr=stderr, check=True, timeout=60)
    text = log_file.read_bytes()
    assert b"\x1b" not in text
    assert b"POST /x 400" in text
    assert b"execution succeeded execution_id=e-1 token=3" in text

"""The servers the migration tests run on: the test server, and a second one when configured."""

from __future__ import annotations

import os

import pytest

from orquestador.config import sqlalchemy_url
from tests.db_support import TestServer

EXTERNAL_URL = os.environ.get("ORQUESTADOR_EXTERNAL_DATABASE_URL")


@pytest.fixture(params=["test-server", "external"])
def server(request: pytest.FixtureRequest, pg_server: TestServer) -> TestServer:
    if request.param == "test-server":
        return pg_server
    if not EXTERNAL_URL:
        pytest.skip("external-database profile off: ORQUESTADOR_EXTERNAL_DATABASE_URL is not set")
    return TestServer(sqlalchemy_url(EXTERNAL_URL))

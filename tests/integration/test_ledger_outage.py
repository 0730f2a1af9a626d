"""A gateway whose SQLite file another process holds locked past the busy
timeout keeps answering, shows the backlog on /metrics, and writes every
row once the lock goes."""

from __future__ import annotations

import os
import sqlite3
import time

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from sessions.database import STATE_FILE
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, CLIENT_KEY, METRICS_TOKEN, OPENAI_MODEL, UPSTREAM_KEY

pytestmark = pytest.mark.slow


def _metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}).text
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


def test_a_locked_database_delays_rows_and_loses_none(fake_upstream, tmp_path) -> None:
    settings = Settings(server=ServerSettings(
        api_keys={"team-a": CLIENT_KEY}, admin_token=ADMIN_TOKEN, metrics_token=METRICS_TOKEN,
        state_dir=str(tmp_path)), workers=(WorkerSettings(
            name="openai-up", dialect="openai", url=fake_upstream.url, api_key=UPSTREAM_KEY,
            models=(OPENAI_MODEL,)),))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as client:
        other = sqlite3.connect(os.path.join(str(tmp_path), STATE_FILE), isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        answered = 0
        end = time.monotonic() + 6.5  # past the 5 s busy timeout
        while time.monotonic() < end:
            started = time.monotonic()
            client.chat.completions.create(model=OPENAI_MODEL,
                                           messages=[{"role": "user", "content": "hi"}])
            assert time.monotonic() - started < 1.0  # requests never wait for the database
            answered += 1
            time.sleep(0.1)
        assert _metric(http, "poolgate_ledger_backlog_rows") > 0
        assert _metric(http, "poolgate_database_up") == 0.0
        assert _metric(http, "poolgate_ledger_write_failures_total") >= 1
        other.execute("ROLLBACK")
        other.close()
        deadline = time.monotonic() + 15
        while _metric(http, "poolgate_ledger_backlog_rows") > 0:
            assert time.monotonic() < deadline, "the backlog was written"
            time.sleep(0.1)
        assert _metric(http, "poolgate_database_up") == 1.0
        rows = http.get("/internal/usage", headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                        params={"group_by": ""}).json()["rows"]
        assert rows[0]["requests"] == answered

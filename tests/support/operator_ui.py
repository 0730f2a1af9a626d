"""The operator page under test: a real poolgate with two process workers
and policy keys, Debian's Chromium through Playwright, and a tab that records
script errors and CSP violations (which must stay empty)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

from app.factory import create_app
from app.key_settings import BudgetSettings, KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

__all__ = ["ADMIN", "ADMIN_TOKEN", "KEYS", "Tab", "browser", "process_worker", "screenshot",
           "server_state", "ui", "ui_gateway"]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ADMIN_TOKEN = "ui-admin-token-7f3a"
KEYS = {"team-a": "sk-ui-team-a", "team-b": "sk-ui-team-b"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ARTIFACTS = REPO / ".cache" / "artifacts"


def process_worker(name: str) -> WorkerSettings:
    return WorkerSettings(name=name, kind="process", models=("echo",), cwd=str(REPO),
                          command=(sys.executable, "-m", "tests.fakes.echo_worker"),
                          backoff_initial=0.2, backoff_max=2.0, health_interval=0.5,
                          health_timeout=1.0, stop_timeout=3.0)


@pytest.fixture(scope="module")
def ui_gateway() -> Iterator[tuple[str, httpx.Client]]:
    """One gateway for the module (two worker processes); a test that drains
    a worker resumes it before it ends."""
    keys = {"team-a": KeySettings(secret=KEYS["team-a"], models=("echo", "claude-*"),
                                  max_in_flight=8, rpm=600, tpm=2_000_000,
                                  budget_tokens=BudgetSettings(day=5_000_000,
                                                               month=100_000_000)),
            "team-b": KeySettings(secret=KEYS["team-b"])}
    settings = Settings(server=ServerSettings(admin_token=ADMIN_TOKEN, keys=keys),
                        workers=(process_worker("p0"), process_worker("p1")))
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv.url, http


@pytest.fixture
async def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Debian's Chromium is not installed at {CHROMIUM} "
                    "(`apt-get install chromium`; `make test` installs it)")
    from playwright.async_api import async_playwright

    # Chromium writes its profile, dconf and pulse state under $HOME
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            await chromium.close()


class Tab:
    """A browser tab on the operator page that records script errors and CSP
    violations, which must stay empty."""

    def __init__(self, page: Any, url: str) -> None:
        self.page = page
        self.url = url
        self.problems: list[str] = []
        page.on("pageerror", lambda exc: self.problems.append(f"pageerror: {exc}"))
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or (
                message.type == "error" and "Failed to load resource" not in message.text):
            self.problems.append(f"console: {message.text}")

    async def sign_in(self, token: str) -> None:
        await self.page.fill("#token", token)
        await self.page.click("#token-submit")

    def worker(self, name: str) -> Any:
        return self.page.locator(f'#workers tr[data-worker="{name}"]')


@pytest.fixture
async def ui(browser: Any, ui_gateway: tuple[str, httpx.Client]) -> AsyncIterator[Tab]:
    url, _ = ui_gateway
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = Tab(await context.new_page(), url)
    await page.page.goto(url + "/internal/ui")
    yield page
    await context.close()
    assert page.problems == []


def server_state(http: httpx.Client, name: str) -> dict[str, Any]:
    workers = http.get("/internal/workers", headers=ADMIN).json()["workers"]
    return next(w for w in workers if w["name"] == name)


async def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    """A full-page PNG in the test's tmp dir, copied to .cache/artifacts/."""
    shot = tmp_path / name
    await page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / name)
    return shot



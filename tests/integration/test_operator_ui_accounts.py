"""The operator page's accounts panel in Debian's Chromium: each cli account's
state, a bar per quota window and the forecast, over a real poolgate with a
real cli worker (the fake Claude Code); hostile text from the server stays
text."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, AsyncIterator

import anthropic
import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.fakes.upstreams import FakeUpstream
from tests.fakes.vendor_quota import FakeQuota
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.operator_ui import ADMIN, ADMIN_TOKEN, Tab, process_worker, screenshot
from tests.support.operator_ui import browser  # noqa: F401 (fixture)
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

MODEL = "claude-sonnet-4-6"
TOKEN = "sk-ant-oat01-ui-quota"
HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


@pytest.fixture
async def cli_page(browser: Any, tmp_path: Path) -> AsyncIterator[tuple[Tab, httpx.Client]]:
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as upstream:
        cli = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                                 upstream.anthropic_url, tmp_path / "a.log")
        settings = Settings(server=ServerSettings(admin_token=ADMIN_TOKEN,
                                                  api_keys={"team": "sk-team"}),
                            workers=(cli, process_worker("p0")))
        with ServerThread(create_app(settings)) as srv, \
                httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: http.get("/internal/accounts", headers=ADMIN)
                     .json()["accounts"][0]["state"] == "ready", timeout=30)
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            context.set_default_timeout(20_000)
            tab = Tab(await context.new_page(), srv.url)
            await tab.page.goto(srv.url + "/internal/ui")
            yield tab, http, upstream
            await context.close()
            assert tab.problems == []


async def test_accounts_panel_bars_forecast_and_state(cli_page, tmp_path: Path) -> None:
    """The real answer first (nothing known yet, then what the fake Claude Code
    read from its upstream's quota headers after a turn), then windows added
    to it in the browser, with hostile text."""
    from playwright.async_api import Route, expect

    tab, http, upstream = cli_page
    extra: list[dict[str, Any] | None] = [None]

    async def with_quota(route: Route) -> None:
        answer = await route.fetch()
        data = await answer.json()
        if extra[0] is not None:
            now = time.time()
            data["accounts"][0].update(extra[0], windows=[
                {**w, "resets_at": now + w["resets_in"]} for w in extra[0]["windows"]])
            data["accounts"].append({"name": "claude-b", "cli": "claude", "account": HOSTILE,
                                     "state": HOSTILE, "models": [MODEL], "source": None,
                                     "windows": [], "headroom_percent": None,
                                     "forecast_empty_at": None})
        await route.fulfill(response=answer, json=data)

    await tab.page.route("**/internal/accounts", with_quota)
    await tab.sign_in(ADMIN_TOKEN)
    panel = tab.page.locator("#accounts-panel")
    await expect(panel).to_be_visible()
    a = tab.page.locator('#accounts tr[data-account="claude-a"]')
    await expect(a.locator(".state")).to_have_text("ready")
    await expect(a.locator("td.quota")).to_have_text("no quota reported yet")
    await expect(a.locator("td.forecast")).to_have_text("—")
    assert http.get("/internal/accounts", headers=ADMIN).json()["accounts"][0]["windows"] == []

    # a turn answered with the vendor's quota headers: the page shows what the CLI read
    upstream.quota[TOKEN] = FakeQuota(five_hour=93, seven_day=40)
    async with anthropic.AsyncAnthropic(base_url=tab.url, api_key="sk-team",
                                        max_retries=0) as client:
        await client.messages.create(model=MODEL, max_tokens=32,
                                     messages=[{"role": "user", "content": "hello"}])
    real = a.locator('.quota-window[data-window="five_hour"]')
    await expect(real.locator('[role="progressbar"]')).to_have_attribute("aria-valuenow", "93")
    await expect(real.locator(".quota-used")).to_have_text("93% used")
    await expect(real.locator(".quota-reset")).to_contain_text(re.compile(r"\(in 2h 5\dm\)"))
    await expect(a.locator("td.forecast .headroom")).to_have_text("7% left in five_hour")

    forecast_at = time.time() + 3600 + 600
    extra[0] = {"source": "vendor", "headroom_percent": 8.0, "tightest_window": "five_hour",
                "forecast_empty_at": forecast_at,
                "windows": [{"window": "five_hour", "used_percent": 92.0, "current": True,
                             "resets_in": 2 * 3600 + 300,
                             "resets_at_iso": "2027-01-15T12:00:00Z", "source": "vendor"},
                            {"window": HOSTILE, "used_percent": 40.0, "current": True,
                             "resets_in": 3 * 86400, "source": "counted"}]}
    five = a.locator('.quota-window[data-window="five_hour"]')
    await expect(five.locator('[role="progressbar"]')).to_have_attribute("aria-valuenow", "92")
    await expect(five.locator(".bar")).to_have_class("bar over")
    await expect(five.locator(".quota-used")).to_have_text("92% used")
    await expect(five.locator(".quota-reset")).to_contain_text(re.compile(r"\(in 2h [45]m\)"))
    await expect(five.locator(".quota-reset")).to_have_attribute("title", "2027-01-15T12:00:00Z")
    width = await five.locator(".bar > span").evaluate("e => e.style.width")
    assert width == "92%"
    await expect(a.locator("td.forecast")).to_contain_text(re.compile(r"runs out in 1h (9|10)m"))
    await expect(a.locator("td.forecast .headroom")).to_have_text("8% left in five_hour")
    # hostile text from the server is text: shown as typed, nothing runs, no element made
    weekly = a.locator(".quota-window").nth(1)
    await expect(weekly.locator(".quota-name")).to_have_text(HOSTILE)
    await expect(weekly.locator(".quota-source")).to_have_text("counted")
    await expect(weekly.locator('[role="progressbar"]')).to_have_attribute("aria-valuenow", "40")
    b = tab.page.locator('#accounts tr[data-account="claude-b"]')
    await expect(b.locator(".state")).to_have_text(HOSTILE)
    await expect(b.locator(".state")).to_have_class("state unknown")
    await expect(b.locator(".account")).to_have_text(HOSTILE)
    assert await tab.page.locator("#accounts img").count() == 0
    assert await tab.page.title() != "pwned"
    await screenshot(tab.page, tmp_path, "operator-ui-accounts.png")

    # the account's state as the gateway changes it shows on the next poll
    assert http.post("/internal/workers/claude-a/drain", headers=ADMIN).status_code == 200
    await expect(a.locator(".state")).to_have_text("draining")

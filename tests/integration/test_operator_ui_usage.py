"""The operator page's usage chart and keys table in Debian's Chromium: the
gateway's own numbers after requests through the real SDKs, edge cases of
the documented shapes, and a gateway that lacks the endpoints."""

from __future__ import annotations

import asyncio
import datetime
import re
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support.operator_ui import ADMIN, ADMIN_TOKEN, KEYS, Tab, screenshot
from tests.support.operator_ui import browser, ui, ui_gateway  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


async def test_usage_and_keys_panels_show_the_gateways_own_numbers(ui: Tab, ui_gateway,
                                                                   tmp_path: Path) -> None:
    """Requests through the real SDKs under two config keys, a run-time key
    made through the API: the page shows what /internal/usage and /internal/keys say."""
    from playwright.async_api import expect

    url, http = ui_gateway
    with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["team-a"], max_retries=0) as oai:
        for i in range(3):
            oai.chat.completions.create(model="echo", messages=[
                {"role": "user", "content": f"hello from team a, request {i}"}])
    with anthropic.Anthropic(base_url=url, api_key=KEYS["team-b"], max_retries=0) as ant:
        for _ in range(2):
            ant.messages.create(model="echo", max_tokens=32,
                                messages=[{"role": "user", "content": "team b here"}])
    created = http.post("/internal/keys", headers=ADMIN, json={"name": "team-c", "rpm": 60})
    assert created.status_code == 201, created.text

    today = _utc_day(0)
    midnight = int(datetime.datetime.fromisoformat(today)
                   .replace(tzinfo=datetime.timezone.utc).timestamp())
    rows: list[dict[str, Any]] = []
    for _ in range(100):  # the ledger writes in batches off the request path
        rows = http.get("/internal/usage", headers=ADMIN, params={
            "since": midnight, "group_by": "key,model,day"}).json()["rows"]
        if sum(r["requests"] for r in rows) == 5:
            break
        await asyncio.sleep(0.1)
    by_key = {r["key"]: r for r in rows}
    assert sorted(by_key) == ["team-a", "team-b"] and by_key["team-a"]["requests"] == 3
    assert all(r["model"] == "echo" and r["day"] == today and r["output_tokens"] > 0
               for r in rows)
    keys = {k["name"]: k for k in http.get("/internal/keys", headers=ADMIN).json()["keys"]}

    await ui.page.clock.install()  # the page's timers run when the test says
    await ui.page.reload()
    await ui.sign_in(ADMIN_TOKEN)
    chart = ui.page.locator("#usage-chart svg")
    await expect(chart.locator(f'rect[data-day="{today}"]')).to_have_count(2)
    ranked = sorted(rows, key=lambda r: (-(r["input_tokens"] + r["output_tokens"]), r["key"]))
    await expect(ui.page.locator("#usage-legend li")).to_have_text(
        [f"{r['key']} · echo — {r['input_tokens'] + r['output_tokens']:,}" for r in ranked])
    table = ui.page.locator("#usage-today tbody tr")
    for i, name in enumerate(("team-a", "team-b")):
        r = by_key[name]
        await expect(table.nth(i).locator("td")).to_have_text(
            [name, "echo", str(r["requests"]), f"{r['input_tokens']:,}",
             f"{r['output_tokens']:,}", f"{r['cached_tokens']:,}", f"{r['errors']:,}"])

    def tokens_today(name: str) -> str:
        used = keys[name]["usage_today"]
        return f"{used['input_tokens'] + used['output_tokens']:,}"

    key_rows = ui.page.locator("#keys tbody tr")
    await expect(key_rows).to_have_count(3)
    await expect(key_rows.nth(0).locator("td")).to_have_text(
        ["team-a", "config", "echo, claude-*", "8", "600", "2,000,000", "5,000,000",
         "100,000,000", "3", tokens_today("team-a")])
    await expect(key_rows.nth(1).locator("td")).to_have_text(
        ["team-b", "config", "all", "—", "—", "—", "—", "—", "2", tokens_today("team-b")])
    await expect(key_rows.nth(2).locator("td")).to_have_text(
        ["team-c", "runtime", "all", "—", "60", "—", "—", "—", "0", "0"])
    await expect(ui.worker("p0")).to_have_attribute("data-state", "ready")

    # one more request: the next usage poll (today only) shows it
    asked: list[str] = []
    ui.page.on("request", lambda request: asked.append(request.url)
               if "/internal/usage" in request.url else None)
    with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["team-b"], max_retries=0) as oai:
        oai.chat.completions.create(model="echo", messages=[{"role": "user", "content": "more"}])
    await ui.page.clock.run_for(15_000)
    await expect(table.nth(1).locator("td").nth(2)).to_have_text("3")
    await expect(key_rows.nth(1).locator("td").nth(8)).to_have_text("3")
    assert asked and all(f"since={midnight}&" in u for u in asked)
    shot = await screenshot(ui.page, tmp_path, "operator-ui.png")
    assert shot.stat().st_size > 10_000


def _utc_day(days_ago: int) -> str:
    today = datetime.datetime.now(datetime.timezone.utc).date()
    return (today - datetime.timedelta(days=days_ago)).isoformat()


def _utc_day_of(unix: int) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).date().isoformat()


def _usage_row(key: str, model: str, days_ago: int, requests: int, tokens_in: int,
               tokens_out: int) -> dict[str, Any]:
    return {"key": key, "model": model, "day": _utc_day(days_ago), "requests": requests,
            "input_tokens": tokens_in, "output_tokens": tokens_out, "cached_tokens": 0,
            "errors": 0}


async def test_usage_chart_and_keys_table_from_the_documented_shapes(ui: Tab) -> None:
    """Edge cases the live gateway cannot produce today (a day 30 days ago,
    several days of history), in the shapes issue 9 fixes for /internal/usage
    and /internal/keys, answered by the browser itself."""
    from playwright.async_api import Route, expect

    rows = [_usage_row("team-a", "gpt-4o-mini", 0, 12, 3000, 1000),
            _usage_row("team-a", "gpt-4o-mini", 3, 40, 9000, 6000),
            _usage_row("team-b", "claude-sonnet-4-6", 0, 5, 200, 50),
            _usage_row("team-b", "claude-sonnet-4-6", 29, 7, 700, 70),
            _usage_row("team-b", "claude-sonnet-4-6", 30, 999, 99999, 9999)]  # outside 30 days
    keys = [{"name": "team-a", "source": "config", "models": ["claude-*", "gpt-4o-mini"],
             "max_in_flight": 8, "rpm": 600, "tpm": 2000000,
             "budget_tokens": {"day": 5000000, "month": 100000000},
             "usage_today": {"requests": 12, "input_tokens": 3000, "output_tokens": 1000}},
            {"name": "team-b", "source": "runtime", "models": None, "max_in_flight": None,
             "rpm": None, "tpm": None, "budget_tokens": None,
             "usage_today": {"requests": 5, "input_tokens": 200, "output_tokens": 50}}]
    asked: list[str] = []

    async def usage(route: Route) -> None:
        asked.append(route.request.url)
        since = _utc_day_of(int(re.search(r"since=(\d+)", route.request.url).group(1)))
        await route.fulfill(json={"since": 0, "until": 0, "group_by": ["key", "model", "day"],
                                  "rows": [r for r in rows if r["day"] >= since]})

    await ui.page.route(re.compile(r"/internal/usage\?"), usage)
    await ui.page.route(re.compile(r"/internal/keys$"),
                        lambda route: route.fulfill(json={"keys": keys}))
    await ui.page.clock.install()  # the page's timers run when the test says
    await ui.page.reload()
    await ui.sign_in(ADMIN_TOKEN)

    chart = ui.page.locator("#usage-chart svg")
    await expect(chart).to_be_visible()
    await expect(chart.locator("rect")).to_have_count(4)  # the day 30 days ago is left out
    await expect(chart.locator(f'rect[data-day="{_utc_day(0)}"]')).to_have_count(2)
    legend = ui.page.locator("#usage-legend li")
    await expect(legend).to_have_text(["team-a · gpt-4o-mini — 19,000",
                                       "team-b · claude-sonnet-4-6 — 1,020"])
    today = ui.page.locator("#usage-today tbody tr")
    await expect(today).to_have_count(2)
    await expect(today.nth(0).locator("td")).to_have_text(
        ["team-a", "gpt-4o-mini", "12", "3,000", "1,000", "0", "0"])
    await ui.page.select_option("#usage-metric", "requests")
    await expect(legend).to_have_text(["team-a · gpt-4o-mini — 52",
                                       "team-b · claude-sonnet-4-6 — 12"])

    since = int(re.search(r"since=(\d+)", asked[0]).group(1))
    midnight = datetime.datetime.fromisoformat(_utc_day(29)).replace(tzinfo=datetime.timezone.utc)
    assert since == int(midnight.timestamp())
    assert "group_by=key,model,day" in asked[0]

    key_rows = ui.page.locator("#keys tbody tr")
    await expect(key_rows.nth(0).locator("td")).to_have_text(
        ["team-a", "config", "claude-*, gpt-4o-mini", "8", "600", "2,000,000", "5,000,000",
         "100,000,000", "12", "4,000"])
    await expect(key_rows.nth(1).locator("td")).to_have_text(
        ["team-b", "runtime", "all", "—", "—", "—", "—", "—", "5", "250"])
    await expect(ui.page.locator("#usage-note")).to_be_hidden()
    await expect(ui.page.locator("#keys-note")).to_be_hidden()

    # later polls ask for today only and keep the days before
    rows[0]["requests"] = 20
    await ui.page.clock.run_for(15_000)
    await expect(today.nth(0).locator("td").nth(2)).to_have_text("20")
    assert len(asked) == 2 and f"since={int(midnight.timestamp()) + 29 * 86400}&" in asked[1]
    await expect(legend).to_have_text(["team-a · gpt-4o-mini — 60",
                                       "team-b · claude-sonnet-4-6 — 12"])
    await expect(chart.locator("rect")).to_have_count(4)

    # a hidden tab polls nothing, and catches up when shown again
    hide = "v => { Object.defineProperty(document, 'hidden', {value: v, configurable: true});" \
           " document.dispatchEvent(new Event('visibilitychange')); }"
    await ui.page.evaluate(hide, True)
    await ui.page.clock.run_for(60_000)
    await asyncio.sleep(1)  # a poll, had there been one, would have reached us by now
    assert len(asked) == 2
    rows[0]["requests"] = 21
    await ui.page.evaluate(hide, False)
    await expect(today.nth(0).locator("td").nth(2)).to_have_text("21")
    assert len(asked) == 3


async def test_usage_and_keys_panels_say_when_the_gateway_lacks_them(ui: Tab) -> None:
    """A gateway from before the usage ledger and keys API (played by the
    browser answering those two paths with poolgate's own 404)."""
    from playwright.async_api import Route, expect

    async def missing(route: Route) -> None:
        path = route.request.url.split("/internal/", 1)[1].split("?")[0]
        await route.fulfill(status=404, json={"error": {
            "message": f"No such endpoint: GET /internal/{path}.", "type": "not_found_error",
            "param": None, "code": None}})

    await ui.page.route(re.compile(r"/internal/(usage|keys)(\?|$)"), missing)
    await ui.sign_in(ADMIN_TOKEN)
    await expect(ui.worker("p0")).to_have_attribute("data-state", "ready")
    for note, path in (("#usage-note", "/internal/usage"), ("#keys-note", "/internal/keys")):
        await expect(ui.page.locator(note)).to_contain_text(f"{path} is not available")
        await expect(ui.page.locator(note)).to_contain_text("404")
    await expect(ui.page.locator("#usage-body")).to_be_hidden()
    await expect(ui.page.locator("#keys")).to_be_hidden()

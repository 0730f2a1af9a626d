"""The operator page (/internal/ui) in Debian's Chromium, driven by Playwright,
over a real poolgate with real process workers."""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anthropic
import httpx
import openai
import pytest

from app.factory import create_app
from app.key_settings import BudgetSettings, KeySettings
from app.settings import ServerSettings, Settings, WorkerSettings
from tests.support.server import ServerThread

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ADMIN_TOKEN = "ui-admin-token-7f3a"
KEYS = {"team-a": "sk-ui-team-a", "team-b": "sk-ui-team-b"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ARTIFACTS = REPO / ".cache" / "artifacts"


def _process_worker(name: str) -> WorkerSettings:
    return WorkerSettings(name=name, kind="process", models=("echo",), cwd=str(REPO),
                          command=(sys.executable, "-m", "tests.fakes.echo_worker"),
                          backoff_initial=0.2, backoff_max=2.0, health_interval=0.5,
                          health_timeout=1.0, stop_timeout=3.0)


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, httpx.Client]]:
    """One gateway for the module (two worker processes); a test that drains
    a worker resumes it before it ends."""
    keys = {"team-a": KeySettings(secret=KEYS["team-a"], models=("echo", "claude-*"),
                                  max_in_flight=8, rpm=600, tpm=2_000_000,
                                  budget_tokens=BudgetSettings(day=5_000_000,
                                                               month=100_000_000)),
            "team-b": KeySettings(secret=KEYS["team-b"])}
    settings = Settings(server=ServerSettings(admin_token=ADMIN_TOKEN, keys=keys),
                        workers=(_process_worker("p0"), _process_worker("p1")))
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


class Page:
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
async def ui(browser: Any, gateway: tuple[str, httpx.Client]) -> AsyncIterator[Page]:
    url, _ = gateway
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = Page(await context.new_page(), url)
    await page.page.goto(url + "/internal/ui")
    yield page
    await context.close()
    assert page.problems == []


def _server_state(http: httpx.Client, name: str) -> dict[str, Any]:
    workers = http.get("/internal/workers", headers=ADMIN).json()["workers"]
    return next(w for w in workers if w["name"] == name)


async def _screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    """A full-page PNG in the test's tmp dir, copied to .cache/artifacts/."""
    shot = tmp_path / name
    await page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / name)
    return shot


async def test_drain_resume_restart_from_the_page(ui: Page, gateway, tmp_path: Path) -> None:
    from playwright.async_api import expect

    _, http = gateway
    await expect(ui.page.locator("#sign-in")).to_be_visible()
    await ui.sign_in(ADMIN_TOKEN)
    p0, p1 = ui.worker("p0"), ui.worker("p1")
    for row in (p0, p1):
        await expect(row).to_have_attribute("data-state", "ready")
        await expect(row.locator("td").nth(1)).to_have_text("process")
        await expect(row.locator("td").nth(2)).to_have_text("echo")
        await expect(row.locator("td").nth(4)).to_have_text(re.compile(r"^0( / \d+)?$"))

    # no worker reports a login: no Login column
    await expect(ui.page.locator("#workers th", has_text="Login")).to_be_hidden()

    await p0.locator('button[data-action="drain"]').click()
    await expect(p0).to_have_attribute("data-state", "draining")
    await expect(p0.locator(".state")).to_have_text("draining")
    await expect(p0.locator('button[data-action="drain"]')).to_be_disabled()
    assert _server_state(http, "p0")["state"] == "draining"
    assert _server_state(http, "p1")["state"] == "ready"

    await p0.locator('button[data-action="resume"]').click()
    await expect(p0).to_have_attribute("data-state", "ready")
    await expect(p0.locator('button[data-action="resume"]')).to_be_disabled()
    assert _server_state(http, "p0")["state"] == "ready"

    # restart asks for a second click, then the child is replaced
    before = _server_state(http, "p1")
    pid = before["pid"]
    restart = p1.locator('button[data-action="restart"]')
    await restart.click()
    await expect(restart).to_have_text("Confirm restart")
    assert _server_state(http, "p1")["pid"] == pid
    await restart.click()
    await expect(p1.locator("td").nth(5)).to_have_text(str(before["restarts"] + 1))
    await expect(p1).to_have_attribute("data-state", "ready")
    assert _server_state(http, "p1")["pid"] != pid

    # a change made elsewhere shows up by itself (the page polls)
    assert http.post("/internal/workers/p1/drain", headers=ADMIN).status_code == 200
    await expect(p1).to_have_attribute("data-state", "draining")

    shot = await _screenshot(ui.page, tmp_path, "operator-ui-workers.png")
    assert shot.stat().st_size > 10_000
    assert http.post("/internal/workers/p1/resume", headers=ADMIN).status_code == 200


async def test_wrong_token_is_refused_and_asked_again(ui: Page, tmp_path: Path) -> None:
    from playwright.async_api import expect

    await ui.sign_in("not-the-admin-token")
    error = ui.page.locator("#token-error")
    await expect(error).to_be_visible()
    await expect(error).to_contain_text("refused this admin token")
    await expect(ui.page.locator("#token")).to_be_visible()
    await expect(ui.page.locator("#panels")).to_be_hidden()
    assert await ui.page.evaluate("sessionStorage.length") == 0
    await _screenshot(ui.page, tmp_path, "operator-ui-wrong-token.png")

    await ui.sign_in(ADMIN_TOKEN)
    await expect(ui.worker("p0")).to_have_attribute("data-state", "ready")
    await expect(error).to_be_hidden()
    # entered once: a reload of the tab stays signed in
    await ui.page.reload()
    await expect(ui.worker("p0")).to_have_attribute("data-state", "ready")
    await expect(ui.page.locator("#sign-in")).to_be_hidden()
    # and "Forget token" forgets it
    await ui.page.click("#sign-out")
    await expect(ui.page.locator("#sign-in")).to_be_visible()
    assert await ui.page.evaluate("sessionStorage.length") == 0


async def test_login_state_url_and_paste_code_box(ui: Page, tmp_path: Path) -> None:
    """cli workers report a login; none is configured here, so the browser
    itself adds the fields to the real /internal/workers answer (the shape
    the page accepts) and lets the code POST through to the real gateway."""
    from playwright.async_api import Route, expect

    lists: list[int] = []
    p1_login: list[Any] = [{"state": "failed", "url": "javascript:alert(1)",
                            "error": "bad password"}]

    async def with_login(route: Route) -> None:
        lists.append(1)
        answer = await route.fetch()
        data = await answer.json()
        logins = {"p0": {"state": "awaiting_code", "url": "https://login.example.test/device",
                         "user_code": "WDJB-MJHT"},
                  "p1": p1_login[0]}
        for worker in data["workers"]:
            worker["login"] = logins[worker["name"]]
        data["workers"][0].update(kind="cli", cli="claude", account="ops@example.test")
        await route.fulfill(response=answer, json=data)

    posted: list[tuple[Any, str | None]] = []

    async def capture(route: Route) -> None:
        request = route.request
        posted.append((request.post_data_json, await request.header_value("authorization")))
        await route.continue_()

    await ui.page.route(re.compile(r"/internal/workers$"), with_login)
    await ui.page.route("**/internal/workers/p0/login/code", capture)
    await ui.sign_in(ADMIN_TOKEN)
    p0, p1 = ui.worker("p0"), ui.worker("p1")
    await expect(ui.page.locator("#workers th", has_text="Login")).to_be_visible()
    await expect(p0.locator("td").nth(1)).to_have_text("cli (claude)")
    await expect(p0.locator(".login .account")).to_have_text("ops@example.test")
    await expect(p0.locator(".login")).to_contain_text("awaiting code")
    await expect(p0.locator("a.login-url")).to_have_attribute(
        "href", "https://login.example.test/device")
    await expect(p0.locator(".login code")).to_have_text("WDJB-MJHT")
    await expect(p1.locator(".login")).to_contain_text("bad password")
    await expect(p1.locator("a.login-url")).to_be_hidden()  # not an http(s) URL: no link
    await expect(p1.locator("form.login-code")).to_be_visible()

    box = p0.get_by_label("login code for p0")
    await box.fill("4/0AbCdEf-code")
    await p0.get_by_role("button", name="Send code").click()
    # the gateway has no login endpoint yet: its answer is shown, not swallowed
    await expect(p0.locator(".login .msg").last).to_contain_text(
        "Sending the code failed (HTTP 404)")
    assert posted == [({"code": "4/0AbCdEf-code"}, f"Bearer {ADMIN_TOKEN}")]
    # a refused code stays in the box for another try, also across the next poll
    p1_login[0] = "ready"  # what cli workers report once logged in: a plain string
    polled = len(lists) + 1
    for _ in range(300):
        if len(lists) > polled:
            break
        await asyncio.sleep(0.05)
    assert len(lists) > polled, "the page stopped polling /internal/workers"
    await expect(box).to_have_value("4/0AbCdEf-code")
    await expect(p0.locator(".login code")).to_have_text("WDJB-MJHT")
    # p1 logged in meanwhile: state shown, no box, no stale error
    await expect(p1.locator(".login")).to_contain_text("ready")
    await expect(p1.locator(".login")).not_to_contain_text("bad password")
    await expect(p1.locator("form.login-code")).to_be_hidden()
    await _screenshot(ui.page, tmp_path, "operator-ui-login.png")


async def test_usage_and_keys_panels_show_the_gateways_own_numbers(ui: Page, gateway,
                                                                   tmp_path: Path) -> None:
    """Requests through the real SDKs under two config keys, a run-time key
    made through the API: the page shows what /internal/usage and /internal/keys say."""
    from playwright.async_api import expect

    url, http = gateway
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
    shot = await _screenshot(ui.page, tmp_path, "operator-ui.png")
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


async def test_usage_chart_and_keys_table_from_the_documented_shapes(ui: Page) -> None:
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


async def test_usage_and_keys_panels_say_when_the_gateway_lacks_them(ui: Page) -> None:
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


async def test_a_gateway_without_admin_token_says_admin_is_disabled(browser: Any) -> None:
    from playwright.async_api import expect

    settings = Settings(server=ServerSettings(), workers=(_process_worker("p0"),))
    with ServerThread(create_app(settings)) as srv:
        context = await browser.new_context()
        page = Page(await context.new_page(), srv.url)
        await page.page.goto(srv.url + "/internal/ui")
        await page.sign_in("any-token")
        error = page.page.locator("#token-error")
        await expect(error).to_contain_text("HTTP 404")
        await expect(error).to_contain_text("Admin endpoints are disabled")
        await expect(page.page.locator("#panels")).to_be_hidden()
        await context.close()
    assert page.problems == []


def test_page_and_assets_are_public_and_carry_no_data(gateway) -> None:
    _, http = gateway
    page = http.get("/internal/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(a for a in assets if a != "data:,") == [
        "ui/static/chart.js", "ui/static/ui.css", "ui/static/ui.js"]
    bodies = [page.text]
    for asset in assets:
        if asset == "data:,":
            continue
        r = http.get("/internal/" + asset)  # relative to /internal/ui
        assert r.status_code == 200, asset
        assert r.headers["content-type"].split(";")[0] in ("text/css", "text/javascript")
        bodies.append(r.text)
    for body in bodies:
        # nothing from the gateway's configuration or state, nothing fetched from elsewhere
        for secret in (ADMIN_TOKEN, *KEYS, *KEYS.values(), "p0", "echo_worker"):
            assert secret not in body
        assert not re.search(r"(?:src|href|url\()\s*=?\s*[\"']?(?:https?:)?//", body)
    assert http.get("/internal/ui/static/nope.js").status_code == 404
    assert http.get("/internal/ui/static/..%2Fapp%2Fsettings.py").status_code == 404

    # what the page calls still wants the admin token
    for method, path in (("GET", "/internal/workers"), ("POST", "/internal/workers/p0/drain"),
                         ("GET", "/internal/stats"), ("GET", "/internal/keys"),
                         ("GET", "/internal/usage?group_by=key,model,day")):
        assert http.request(method, path).status_code == 401
        assert http.request(method, path,
                            headers={"authorization": "Bearer wrong"}).status_code == 401
    assert _server_state(http, "p0")["state"] == "ready"

"""The operator page (/internal/ui) in Debian's Chromium, driven by Playwright,
over a real poolgate with real process workers: signing in, the workers panel
and its buttons, login fields, and what is public."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings
from tests.support.operator_ui import ADMIN, ADMIN_TOKEN, KEYS, Tab, process_worker, screenshot, \
    server_state
from tests.support.operator_ui import browser, ui, ui_gateway  # noqa: F401 (fixtures)
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow


async def test_drain_resume_restart_from_the_page(ui: Tab, ui_gateway, tmp_path: Path) -> None:
    from playwright.async_api import expect

    _, http = ui_gateway
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
    assert server_state(http, "p0")["state"] == "draining"
    assert server_state(http, "p1")["state"] == "ready"

    await p0.locator('button[data-action="resume"]').click()
    await expect(p0).to_have_attribute("data-state", "ready")
    await expect(p0.locator('button[data-action="resume"]')).to_be_disabled()
    assert server_state(http, "p0")["state"] == "ready"

    # restart asks for a second click, then the child is replaced
    before = server_state(http, "p1")
    pid = before["pid"]
    restart = p1.locator('button[data-action="restart"]')
    await restart.click()
    await expect(restart).to_have_text("Confirm restart")
    assert server_state(http, "p1")["pid"] == pid
    await restart.click()
    await expect(p1.locator("td").nth(5)).to_have_text(str(before["restarts"] + 1))
    await expect(p1).to_have_attribute("data-state", "ready")
    assert server_state(http, "p1")["pid"] != pid

    # a change made elsewhere shows up by itself (the page polls)
    assert http.post("/internal/workers/p1/drain", headers=ADMIN).status_code == 200
    await expect(p1).to_have_attribute("data-state", "draining")

    shot = await screenshot(ui.page, tmp_path, "operator-ui-workers.png")
    assert shot.stat().st_size > 10_000
    assert http.post("/internal/workers/p1/resume", headers=ADMIN).status_code == 200


async def test_wrong_token_is_refused_and_asked_again(ui: Tab, tmp_path: Path) -> None:
    from playwright.async_api import expect

    await ui.sign_in("not-the-admin-token")
    error = ui.page.locator("#token-error")
    await expect(error).to_be_visible()
    await expect(error).to_contain_text("refused this admin token")
    await expect(ui.page.locator("#token")).to_be_visible()
    await expect(ui.page.locator("#panels")).to_be_hidden()
    assert await ui.page.evaluate("sessionStorage.length") == 0
    await screenshot(ui.page, tmp_path, "operator-ui-wrong-token.png")

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


async def test_login_state_url_and_paste_code_box(ui: Tab, tmp_path: Path) -> None:
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
    # p0 is a process worker, without an account to log in: the gateway's refusal (404,
    # as for starting its login) is shown, not swallowed
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
    await screenshot(ui.page, tmp_path, "operator-ui-login.png")


async def test_a_gateway_without_admin_token_says_admin_is_disabled(browser: Any) -> None:
    from playwright.async_api import expect

    settings = Settings(server=ServerSettings(), workers=(process_worker("p0"),))
    with ServerThread(create_app(settings)) as srv:
        context = await browser.new_context()
        page = Tab(await context.new_page(), srv.url)
        await page.page.goto(srv.url + "/internal/ui")
        await page.sign_in("any-token")
        error = page.page.locator("#token-error")
        await expect(error).to_contain_text("HTTP 404")
        await expect(error).to_contain_text("Admin endpoints are disabled")
        await expect(page.page.locator("#panels")).to_be_hidden()
        await context.close()
    assert page.problems == []


def test_page_and_assets_are_public_and_carry_no_data(ui_gateway) -> None:
    _, http = ui_gateway
    page = http.get("/internal/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(a for a in assets if a != "data:,") == [
        "ui/static/accounts.js", "ui/static/chart.js", "ui/static/login.js", "ui/static/ui.css",
        "ui/static/ui.js"]
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
                         ("GET", "/internal/accounts"),
                         ("GET", "/internal/usage?group_by=key,model,day")):
        assert http.request(method, path).status_code == 401
        assert http.request(method, path,
                            headers={"authorization": "Bearer wrong"}).status_code == 401
    assert server_state(http, "p0")["state"] == "ready"

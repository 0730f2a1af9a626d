"""Auto-login through real Chromium (Debian's, driven by Playwright) and a
fake identity provider: success, a wrong password (no retry), a hanging step
(timeout, with a screenshot), two logins at once without crossing credentials."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import pytest

from auth.autologin import (CHROMIUM, AutoLoginError, BrowserMissing, Credentials, LoginTimeout, MissingCredentials,
                            WrongPassword, auto_login)
from auth.recipes import RecipeError, load_recipe, parse_recipe
from tests.fakes.egress_proxy import EgressProxy
from tests.fakes.idp import FakeIdP

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "login-recipes" / "form-consent.toml"
PNG = b"\x89PNG\r\n\x1a\n"

needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"Chromium is not installed at {CHROMIUM} (Debian package 'chromium'; make test "
           "installs it)")


@pytest.fixture
def idp():
    with FakeIdP({"alice@example.com": "pw-alice", "bob@example.com": "pw-bob",
                  "slow": "pw-slow"}, hang_seconds=20) as server:
        yield server


def start_url(idp: FakeIdP, state: str) -> str:
    return idp.authorize_url(f"{idp.url}/oauth/code/callback", state)


@needs_chromium
async def test_a_login_gets_the_code_and_state_of_its_own_flow(idp: FakeIdP) -> None:
    recipe = load_recipe(RECIPE)
    state = secrets.token_hex(6)
    result = await auto_login(recipe, start_url(idp, state),
                              Credentials("alice@example.com", "pw-alice"), timeout=30)
    code, _, got_state = result.code.partition("#")
    assert code.startswith("c-alice@example.com-") and got_state == state
    assert code in idp.codes  # issued, not yet exchanged
    assert "pw-alice" not in repr(result) and code not in repr(result)


@needs_chromium
async def test_a_wrong_password_is_said_and_not_retried(idp: FakeIdP) -> None:
    with pytest.raises(WrongPassword) as info:
        await auto_login(load_recipe(RECIPE), start_url(idp, "s"),
                         Credentials("alice@example.com", "not-her-password"), timeout=30)
    err = info.value
    assert err.retry is False and err.reason == "wrong_password"
    assert "Invalid username or password" in err.message
    assert "not-her-password" not in err.message + (err.page_text or "")
    assert err.screenshot is not None and err.screenshot.startswith(PNG)


@needs_chromium
async def test_a_hanging_step_times_out_with_a_screenshot(idp: FakeIdP) -> None:
    with pytest.raises(LoginTimeout) as info:
        await auto_login(load_recipe(RECIPE), start_url(idp, "s"), Credentials("slow", "pw-slow"),
                         timeout=6, step_timeout=3)
    err = info.value
    assert err.retry is True and err.reason == "timeout"
    # taken while the consent POST is still pending (Playwright's own would hang: CDP fallback)
    assert err.screenshot is not None and err.screenshot.startswith(PNG)
    assert len(err.screenshot) > 1000


@needs_chromium
async def test_two_logins_at_once_do_not_cross_credentials(idp: FakeIdP) -> None:
    recipe = load_recipe(RECIPE)
    users = {"alice@example.com": "pw-alice", "bob@example.com": "pw-bob"}
    states = {u: secrets.token_hex(6) for u in users}
    results = await asyncio.gather(*(
        auto_login(recipe, start_url(idp, states[u]), Credentials(u, p), timeout=60)
        for u, p in users.items()))
    for user, result in zip(users, results):
        code, _, state = result.code.partition("#")
        assert code.startswith(f"c-{user}-") and state == states[user]
        assert idp.codes[code]["user"] == user and idp.codes[code]["state"] == states[user]


PROXY_PASSWORD = "proxy-pw-5551234"
IDP_HOST = "idp.egress.test"  # .test never resolves here: only the proxy's DNS knows it


def _proxied(idp: FakeIdP) -> EgressProxy:
    return EgressProxy(credentials=f"egress:{PROXY_PASSWORD}", hosts={IDP_HOST: "127.0.0.1"})


@needs_chromium
async def test_the_browser_goes_through_the_accounts_proxy_and_nowhere_else(idp: FakeIdP) -> None:
    port = idp.server.server_address[1]
    remote = f"http://{IDP_HOST}:{port}"
    with _proxied(idp) as proxy:
        url = idp.authorize_url(f"{remote}/oauth/code/callback", "s").replace(idp.url, remote)
        result = await auto_login(load_recipe(RECIPE), url,
                                  Credentials("alice@example.com", "pw-alice"), timeout=30,
                                  proxy=proxy.url)
        assert result.code.startswith("c-alice@example.com-")
        # (Chromium's first try carries no credentials: the proxy's 407 asks for them)
        assert f"{IDP_HOST}:{port}" in proxy.targets()
        # every page, form post and redirect the IdP saw came through the proxy
        assert idp.requests and all(via for _m, _p, via in idp.requests), idp.requests
        seen = len(idp.requests)
        proxy.stop()  # down: the login fails, nothing goes direct
        with pytest.raises(AutoLoginError) as info:
            await auto_login(load_recipe(RECIPE), url,
                             Credentials("alice@example.com", "pw-alice"), timeout=15,
                             proxy=proxy.url)
        assert len(idp.requests) == seen
        assert PROXY_PASSWORD not in info.value.message + (info.value.page_text or "")


@needs_chromium
async def test_a_redirect_to_this_hosts_callback_listener_does_not_go_through_the_proxy(
        idp: FakeIdP) -> None:
    """Codex's login ends at its own listener on 127.0.0.1: the proxy's host
    cannot reach that, and the code must not pass there."""
    port = idp.server.server_address[1]
    remote = f"http://{IDP_HOST}:{port}"
    with _proxied(idp) as proxy:
        url = idp.authorize_url(f"http://127.0.0.1:{port}/oauth/code/callback", "s").replace(
            idp.url, remote)
        result = await auto_login(load_recipe(RECIPE), url,
                                  Credentials("alice@example.com", "pw-alice"), timeout=30,
                                  proxy=proxy.url)
        assert result.code.startswith("c-alice@example.com-")
        callbacks = [via for _m, p, via in idp.requests if p == "/oauth/code/callback"]
        assert callbacks == [None]  # direct, on this host
        assert f"127.0.0.1:{port}" not in proxy.targets()
        at = [p for _m, p, _via in idp.requests].index("/oauth/code/callback")
        assert all(via for _m, _p, via in idp.requests[:at]), idp.requests  # the IdP's pages


@needs_chromium
async def test_a_proxy_that_refuses_the_credentials_fails_the_login_without_them(
        idp: FakeIdP) -> None:
    port = idp.server.server_address[1]
    remote = f"http://{IDP_HOST}:{port}"
    with _proxied(idp) as proxy:
        wrong = proxy.url.replace(PROXY_PASSWORD, "not-the-password-777")
        with pytest.raises(AutoLoginError) as info:
            await auto_login(load_recipe(RECIPE),
                             idp.authorize_url(f"{remote}/oauth/code/callback", "s").replace(
                                 idp.url, remote),
                             Credentials("alice@example.com", "pw-alice"), timeout=15,
                             proxy=wrong)
        assert proxy.refused and idp.requests == []
        assert "not-the-password-777" not in info.value.message + (info.value.page_text or "")


async def test_a_missing_browser_is_said(idp: FakeIdP, tmp_path: Path) -> None:
    with pytest.raises(BrowserMissing) as info:
        await auto_login(load_recipe(RECIPE), start_url(idp, "s"), Credentials("a", "b"),
                         executable=str(tmp_path / "no-chromium"), timeout=20)
    assert info.value.retry is False and "cannot start Chromium" in info.value.message


def test_recipes_are_checked_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="steps"):
        parse_recipe({"success": {"url": "x"}})
    with pytest.raises(RecipeError, match=r"steps\[0\]: give exactly one"):
        parse_recipe({"steps": [{"fill": "#a", "click": "#b"}], "success": {"url": "x"}})
    with pytest.raises(RecipeError, match="success"):
        parse_recipe({"steps": [{"click": "#b"}]})
    with pytest.raises(RecipeError, match="code.from"):
        parse_recipe({"steps": [{"click": "#b"}], "success": {"url": "x"}, "code": {"from": "x"}})
    bad = tmp_path / "r.json"
    bad.write_text("{")
    with pytest.raises(RecipeError, match="not valid json"):
        load_recipe(bad)
    assert load_recipe(RECIPE).wrong_password_texts == ("Invalid username or password",)


@needs_chromium
async def test_a_second_factor_from_the_totp_secret(tmp_path: Path) -> None:
    seed = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"
    with FakeIdP({"carol@example.com": "pw-carol"}, totp={"carol@example.com": seed}) as idp:
        text = RECIPE.read_text().replace(
            '[[steps]]\nclick = "#submit"',
            '[[steps]]\nfill = "#otp"\nvalue = "{totp}"\n\n[[steps]]\nclick = "#submit"')
        with_otp = tmp_path / "with-otp.toml"
        with_otp.write_text(text)
        recipe = load_recipe(with_otp)
        assert recipe.needs_totp()
        with pytest.raises(WrongPassword):  # no code, or a wrong one: refused like a password
            await auto_login(load_recipe(RECIPE), start_url(idp, "s"),
                             Credentials("carol@example.com", "pw-carol"), timeout=30)
        result = await auto_login(recipe, start_url(idp, "s2"),
                                  Credentials("carol@example.com", "pw-carol", seed), timeout=30)
        assert result.code.startswith("c-carol@example.com-") and result.code.endswith("#s2")
        with pytest.raises(MissingCredentials, match="no totp_secret") as missing:
            await auto_login(recipe, start_url(idp, "s3"),
                             Credentials("carol@example.com", "pw-carol"), timeout=30)
        assert missing.value.retry is False
        with pytest.raises(MissingCredentials, match="not a valid TOTP seed"):
            await auto_login(recipe, start_url(idp, "s4"),
                             Credentials("carol@example.com", "pw-carol", "JBSWY3DP"), timeout=30)

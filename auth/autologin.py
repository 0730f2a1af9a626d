"""Automatic login in a headless browser: Playwright's async API driving
Debian's Chromium through a :class:`~auth.recipes.Recipe`.

One login is one browser and one fresh context (no cookie of one account can
reach another), with ``HOME`` pointed at a temporary directory (Chromium
writes there), the whole of it bounded by ``timeout``. On failure the caller
gets a screenshot (Playwright's, or raw CDP ``Page.captureScreenshot`` when a
navigation is pending and Playwright's would hang) and the page's error text,
with the credentials scrubbed out of it.

This module imports nothing of poolgate's; the gateway passes in everything.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .recipes import Recipe, Step

__all__ = ["Credentials", "LoginResult", "AutoLoginError", "WrongPassword", "LoginTimeout",
           "MissingCredentials",
           "BrowserMissing", "auto_login", "CHROMIUM"]

CHROMIUM = "/usr/bin/chromium"
_SHOT_TIMEOUT_MS = 1500
_TEXT_LIMIT = 400


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str = field(repr=False)
    password: str = field(repr=False)
    totp_secret: str | None = field(default=None, repr=False)

    def totp(self) -> str:
        if not self.totp_secret:
            raise MissingCredentials("the recipe asks for a TOTP code but no totp_secret is set")
        import pyotp  # only accounts with TOTP need it

        try:
            return str(pyotp.TOTP(self.totp_secret).now())
        except (ValueError, TypeError):  # not base32, or too short (pyotp wants >= 112 bits)
            raise MissingCredentials("the totp_secret is not a valid TOTP seed (base32, 112 "
                                     "bits or more)") from None

    def scrub(self, text: str) -> str:
        for secret in (self.password, self.username, self.totp_secret):
            if secret:
                text = text.replace(secret, "***")
        return text


@dataclass(frozen=True, slots=True)
class LoginResult:
    final_url: str = field(repr=False)  # may carry the code
    code: str | None = field(default=None, repr=False)  # what the CLI wants pasted, if any
    seconds: float = 0.0


class AutoLoginError(Exception):
    """A login that did not get through; ``reason`` is a metric label."""

    reason = "idp_error"
    retry = True

    def __init__(self, message: str, *, reason: str | None = None,
                 screenshot: bytes | None = None, page_text: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.screenshot = screenshot
        self.page_text = page_text


class MissingCredentials(AutoLoginError):
    """The account's settings lack what the recipe needs: retrying cannot help."""

    reason = "no_credentials"
    retry = False


class WrongPassword(AutoLoginError):
    """The provider said the credentials are wrong: retrying would lock the account."""

    reason = "wrong_password"
    retry = False


class LoginTimeout(AutoLoginError):
    reason = "timeout"


class BrowserMissing(AutoLoginError):
    reason = "no_browser"
    retry = False


async def auto_login(recipe: Recipe, url: str, credentials: Credentials, *,
                     timeout: float = 120.0, step_timeout: float = 30.0,
                     executable: str = CHROMIUM, proxy: str | None = None) -> LoginResult:
    """Open ``url`` and follow ``recipe``; the final URL and the code to paste.

    ``proxy`` (the account's egress proxy, ``http://[user:pass@]host:port``):
    every request of the browser to another host goes through it, or fails;
    none goes direct. Loopback does not: it is this host (a CLI's callback
    listener, Codex's on 127.0.0.1:1455), which the proxy's host cannot reach,
    and an authorization code must not travel there."""
    from playwright.async_api import Error as PlaywrightError, async_playwright
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="poolgate-browser-") as home:
        async with async_playwright() as pw:
            try:
                browser = await pw.chromium.launch(
                    executable_path=executable, headless=True, env={"HOME": home},
                    proxy=_playwright_proxy(proxy))
            except PlaywrightError as exc:
                raise BrowserMissing(f"cannot start Chromium at {executable} "
                                     f"({_first_line(str(exc))})") from None
            try:
                context = await browser.new_context(user_agent=recipe.user_agent)
                context.set_default_timeout(min(step_timeout, timeout) * 1000)
                page = await context.new_page()
                try:
                    async with asyncio.timeout(timeout):
                        await page.goto(url)
                        for step in recipe.steps:
                            await _run_step(page, step, recipe, credentials)
                        await _await_success(page, recipe, credentials)
                        code = await _code(page, recipe)
                except (TimeoutError, PlaywrightError) as exc:
                    shot, text = await _evidence(context, page, recipe, credentials)
                    timed_out = isinstance(exc, (TimeoutError, PlaywrightTimeout))
                    cls = LoginTimeout if timed_out else AutoLoginError
                    message = (f"the login page did not get through in time ({timeout:g} s)"
                               if timed_out else f"the browser failed: {_first_line(str(exc))}")
                    raise cls(credentials.scrub(message), screenshot=shot, page_text=text) from None
                except AutoLoginError as exc:
                    if exc.screenshot is None:
                        exc.screenshot, _ = await _evidence(context, page, recipe, credentials)
                    raise
                return LoginResult(final_url=page.url, code=code,
                                   seconds=time.monotonic() - started)
            finally:
                with contextlib.suppress(Exception):
                    await browser.close()


def _playwright_proxy(url: str | None) -> dict[str, str] | None:
    """Playwright's ``proxy`` option: the server without its credentials, which
    go apart (Chromium answers the proxy's 407 with them); never logged."""
    if url is None:
        return None
    parts = urlsplit(url)
    server = f"{parts.scheme}://{parts.hostname}:{parts.port}"
    if ":" in (parts.hostname or ""):
        server = f"{parts.scheme}://[{parts.hostname}]:{parts.port}"
    # naming loopback here keeps Playwright from adding "<-loopback>" (it proxies
    # loopback by default); Chromium's own rule then sends 127/8, ::1, localhost direct
    option = {"server": server, "bypass": "localhost,127.0.0.1,[::1]"}
    if parts.username is not None:
        option["username"] = unquote(parts.username)
        option["password"] = unquote(parts.password or "")
    return option


async def _run_step(page: Any, step: Step, recipe: Recipe, credentials: Credentials) -> None:
    if step.action == "goto":
        await page.goto(step.target)
        return
    locator = page.locator(step.target).first
    if step.optional and not await page.locator(step.target).count():
        return
    if step.action == "fill":
        await locator.fill(_value(step.value or "", credentials))
    elif step.action == "click":
        await locator.click()
    elif step.action == "press":
        await locator.press(step.value or "Enter")
    else:  # wait_for: the first of the selectors, then see whether it is the failure
        await locator.wait_for()
    await _check_failure(page, recipe, credentials)


def _value(template: str, credentials: Credentials) -> str:
    value = template.replace("{username}", credentials.username)
    value = value.replace("{password}", credentials.password)
    if "{totp}" in value:
        value = value.replace("{totp}", credentials.totp())
    return value


async def _check_failure(page: Any, recipe: Recipe, credentials: Credentials) -> None:
    if not recipe.failure_selector:
        return
    failure = page.locator(recipe.failure_selector)
    if not await failure.count():
        return
    text = credentials.scrub((await failure.first.inner_text()).strip())[:_TEXT_LIMIT]
    wrong = any(t.lower() in text.lower() for t in recipe.wrong_password_texts)
    cls = WrongPassword if wrong else AutoLoginError
    raise cls(f"the login page said: {text}" if text else "the login page showed an error",
              page_text=text)


async def _await_success(page: Any, recipe: Recipe, credentials: Credentials) -> None:
    if recipe.success_url is not None:
        pattern = recipe.success_url
        await page.wait_for_url(lambda u: bool(pattern.search(u)), wait_until="commit")
    if recipe.success_selector:
        await page.locator(recipe.success_selector).first.wait_for()
    await _check_failure(page, recipe, credentials)


async def _code(page: Any, recipe: Recipe) -> str | None:
    if recipe.code_from == "none":
        return None
    if recipe.code_from == "text":
        text = (await page.locator(recipe.code_selector).first.inner_text()).strip()
        if not text:
            raise AutoLoginError("the page that should show the code is empty", reason="no_code")
        return text
    query = dict(parse_qsl(urlsplit(page.url).query))
    if recipe.code_param not in query:  # a CLI's own listener took it (Codex): nothing to paste
        return None
    values = {"code": query[recipe.code_param]}
    if recipe.state_param:
        values["state"] = query.get(recipe.state_param, "")
    return recipe.code_format.format(**values)


async def _evidence(context: Any, page: Any, recipe: Recipe,
                    credentials: Credentials) -> tuple[bytes | None, str | None]:
    """A screenshot and the page's error text, each within a short deadline."""
    shot: bytes | None = None
    try:
        shot = await page.screenshot(timeout=_SHOT_TIMEOUT_MS)
    except Exception:  # a pending navigation makes Playwright's screenshot hang: raw CDP
        with contextlib.suppress(Exception):
            cdp = await context.new_cdp_session(page)
            async with asyncio.timeout(_SHOT_TIMEOUT_MS / 1000):
                data = await cdp.send("Page.captureScreenshot", {"format": "png"})
            shot = base64.b64decode(data["data"])
    text: str | None = None
    selector = recipe.failure_selector or "body"
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_SHOT_TIMEOUT_MS / 1000):
            locator = page.locator(selector)
            if await locator.count():
                text = (await locator.first.inner_text(timeout=_SHOT_TIMEOUT_MS)).strip()
    if text:
        text = re.sub(r"\s+", " ", credentials.scrub(text))[:_TEXT_LIMIT]
    return shot, text


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else "no detail"

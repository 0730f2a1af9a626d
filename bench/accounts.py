#!/usr/bin/env python3
"""What account operations cost: auto-login in the browser alone, a whole
login through poolgate (the CLI's login, the browser, the worker's restart
and the one-token confirming turn), and bundle export/import.

Everything runs offline on 127.0.0.1: the fake identity provider and the fake
Claude CLI of tests/fakes, Debian's Chromium. Prints a markdown table of
medians and ranges (seconds); the ratio column is the whole login over the
browser part, i.e. what the CLI, the restart and the confirmation add.

    .venv/bin/python bench/accounts.py            # 5 browser logins, 3 gateway logins
    .venv/bin/python bench/accounts.py -n 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from app.account_settings import LoginSettings  # noqa: E402
from app.factory import create_app  # noqa: E402
from app.settings import ServerSettings, Settings  # noqa: E402
from auth.autologin import Credentials, auto_login  # noqa: E402
from auth.recipes import load_recipe  # noqa: E402
from sessions.bundles import export_bundle, import_bundle  # noqa: E402
from tests.fakes.idp import FakeIdP  # noqa: E402
from tests.fakes.upstreams import FakeUpstream  # noqa: E402
from tests.support.cli_accounts import claude_home, fake_claude_worker  # noqa: E402
from tests.support.server import ServerThread  # noqa: E402

RECIPE = ROOT / "examples" / "login-recipes" / "form-consent.toml"
ADMIN = {"authorization": "Bearer admin"}
USER, PASSWORD = "bench@example.com", "pw-bench"


def browser_logins(idp: FakeIdP, n: int) -> list[float]:
    recipe = load_recipe(RECIPE)
    times = []
    for i in range(n):
        started = time.monotonic()
        asyncio.run(auto_login(recipe, idp.authorize_url(f"{idp.url}/oauth/code/callback",
                                                         f"s{i}"),
                               Credentials(USER, PASSWORD), timeout=60))
        times.append(time.monotonic() - started)
    return times


def gateway_logins(idp: FakeIdP, n: int, root: Path) -> list[float]:
    times = []
    with FakeUpstream(models=("claude-sonnet-4-6",)) as upstream:
        for i in range(n):
            worker = fake_claude_worker(
                f"bench-{i}", root / f"home-{i}", upstream.anthropic_url, root / f"{i}.log",
                env={"FAKE_CLAUDE_OAUTH_URL": idp.url},
                login=LoginSettings(recipe=str(RECIPE), username=SecretStr(USER),
                                    password=SecretStr(PASSWORD), relogin=False))
            settings = Settings(server=ServerSettings(admin_token="admin"), workers=(worker,))
            with ServerThread(create_app(settings)) as srv, \
                    httpx.Client(base_url=srv.url, timeout=120, headers=ADMIN) as http:
                path = f"/internal/workers/bench-{i}/login"
                while http.get(path).json()["login"] != "logged_out":
                    time.sleep(0.05)
                started = time.monotonic()
                http.post(path, json={})
                while (state := http.get(path).json()["state"]) not in ("ready", "failed"):
                    time.sleep(0.05)
                assert state == "ready", http.get(path).json()
                times.append(time.monotonic() - started)
    return times


def bundle_round_trips(n: int, root: Path) -> tuple[list[float], list[float]]:
    home = claude_home(root / "bundle-src", "sk-ant-oat01-bench")
    exports, imports = [], []
    for i in range(n):
        started = time.monotonic()
        data = export_bundle("claude", home, version="2.1.197")
        exports.append(time.monotonic() - started)
        started = time.monotonic()
        import_bundle(data, "claude", root / f"bundle-dst-{i}")
        imports.append(time.monotonic() - started)
    return exports, imports


def row(name: str, times: list[float], base: float | None = None) -> str:
    median = statistics.median(times)
    ratio = f"{median / base:.2f}" if base else ""
    return f"| {name} | {len(times)} | {median:.4f} | {min(times):.4f}–{max(times):.4f} | {ratio} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="browser logins (gateway logins: n-2)")
    args = parser.parse_args()
    with FakeIdP({USER: PASSWORD}) as idp, tempfile.TemporaryDirectory() as tmp:
        browser = browser_logins(idp, args.n)
        gateway = gateway_logins(idp, max(1, args.n - 2), Path(tmp))
        exports, imports = bundle_round_trips(20, Path(tmp))
    base = statistics.median(browser)
    print("| operation | n | median s | range s | ratio to browser |")
    print("|---|---|---|---|---|")
    print(row("auto-login, browser only (fresh Chromium + context)", browser))
    print(row("login through poolgate (CLI + browser + restart + 1-token turn)", gateway, base))
    print(row("bundle export (Claude home)", exports))
    print(row("bundle import (checked, staged, renamed)", imports))


if __name__ == "__main__":
    main()

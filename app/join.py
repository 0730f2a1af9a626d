"""``poolgate join``: register a remote worker with a running gateway
(``POST /internal/workers``), e.g. a vLLM server as it comes up. The admin
token comes from the environment (``POOLGATE_ADMIN_TOKEN``), never argv, and
goes to ``--gateway`` only: a redirect is never followed (it would carry the
token to whatever host the answer names); it fails, saying where it pointed.

Stdlib HTTP only: it runs in the gateway's image beside the gateway."""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["add_join_parser", "join"]

ADMIN_TOKEN_ENV = "POOLGATE_ADMIN_TOKEN"
EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


def add_join_parser(commands: Any) -> None:
    join_cmd = commands.add_parser("join", help="register a remote worker with a running gateway")
    join_cmd.add_argument("--gateway", required=True, metavar="URL",
                          help="the gateway's base URL, e.g. http://poolgate:8000")
    join_cmd.add_argument("--name", required=True)
    join_cmd.add_argument("--dialect", required=True, choices=("openai", "anthropic", "gemini"))
    join_cmd.add_argument("--url", required=True, metavar="URL",
                          help="OpenAI base URL with /v1, or the Anthropic root")
    join_cmd.add_argument("--model", action="append", required=True, dest="models",
                          help="a model it serves (repeat for more)")
    join_cmd.add_argument("--alias", action="append", default=[], metavar="ALIAS=MODEL")
    join_cmd.add_argument("--api-key-env", metavar="VAR",
                          help="the environment variable (of the gateway) holding its key; "
                               "the gateway's server.runtime_secret_envs must list it")
    join_cmd.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                          help="keep trying this long while the gateway is unreachable")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Every 3xx stays an error (``HTTPError``) instead of a new request with our headers."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def join(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO) -> int:
    token = environ.get(ADMIN_TOKEN_ENV)
    if not token:
        print(f"poolgate join: set {ADMIN_TOKEN_ENV} (the gateway's admin token)", file=out)
        return EXIT_REFUSED
    aliases: dict[str, str] = {}
    for entry in args.alias:
        alias, eq, model = entry.partition("=")
        if not eq or not alias or not model:
            print(f"poolgate join: --alias {entry!r} is not ALIAS=MODEL", file=out)
            return EXIT_REFUSED
        aliases[alias] = model
    body: dict[str, Any] = {"name": args.name, "dialect": args.dialect, "url": args.url,
                            "models": args.models, "aliases": aliases}
    if args.api_key_env:
        body["api_key_env"] = args.api_key_env
    request = urllib.request.Request(
        args.gateway.rstrip("/") + "/internal/workers", data=json.dumps(body).encode(),
        method="POST", headers={"authorization": f"Bearer {token}",
                                "content-type": "application/json"})
    deadline = time.monotonic() + args.wait
    while True:
        try:
            with _OPENER.open(request, timeout=30) as resp:
                worker = json.load(resp)
            print(f"poolgate join: {worker['name']} joined ({worker['state']}), serving "
                  f"{', '.join(worker['models'])}", file=out)
            return EXIT_OK
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                print(f"poolgate join: the gateway answered with a redirect ({exc.code}) to "
                      f"{exc.headers.get('location', '?')}; the admin token is never sent on to "
                      "another URL: give that URL as --gateway", file=out)
                return EXIT_FAILED
            message = _error_message(exc)
            if exc.code == 409 and "already registered" in message:
                print(f"poolgate join: {args.name} is already registered", file=out)
                return EXIT_OK  # a restarted join container: nothing to do
            print(f"poolgate join: refused ({exc.code}): {message}", file=out)
            return EXIT_FAILED
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() > deadline:
                print(f"poolgate join: cannot reach {args.gateway}: {exc}", file=out)
                return EXIT_FAILED
            time.sleep(1.0)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(exc)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return exc.reason or "no detail"

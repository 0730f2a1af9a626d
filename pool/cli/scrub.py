"""What a vendor CLI prints, made fit for a log line.

A CLI may print its bearer token, an API key or a whole credentials file on
stderr (or in an error ``result``). None of that goes to a client (the host
sends poolgate's own message); for the logs, :func:`scrub` removes
credential *shapes* (``sk-…`` keys, ``Bearer …``, JWTs, long hex or base64
runs) and every secret *value* the account holds (:func:`account_secrets`:
the string values of its credential files, the secret-looking keys of its
settings and ``.env`` files, and the secret-looking variables of the worker's
environment), and cuts the rest.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import urlsplit

__all__ = ["scrub", "account_secrets", "REDACTED"]

REDACTED = "[redacted]"
_MIN_SECRET = 8      # shorter values would redact ordinary words
_LIMIT = 300         # characters of vendor text a log line keeps

_SHAPES = re.compile("|".join((
    r"(?i:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}",           # Authorization values
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}",                             # sk-ant-…, sk-proj-…, sk-…
    r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",    # JWTs
    r"\b[0-9a-fA-F]{32,}\b",                                         # long hex
    r"(?<![A-Za-z0-9+/_-])(?=[A-Za-z0-9+/_=-]*\d)(?=[A-Za-z0-9+/_=-]*[A-Za-z])"
    r"[A-Za-z0-9+/_-]{32,}={0,2}",                                   # long base64 / urlsafe
)))

# files holding nothing but credentials: every string in them is a secret
_CREDENTIAL_FILES = (".credentials.json", "auth.json", "oauth_creds.json",
                     ".claude/.credentials.json", ".codex/auth.json", ".qwen/oauth_creds.json")
# files holding credentials among settings: values under secret-looking keys
_SETTINGS_FILES = ("settings.json", ".claude.json", ".qwen/settings.json", ".claude/settings.json")
_DOTENV_FILES = (".env", ".qwen/.env")
# proxy: an egress proxy URL may carry a user and password
_SECRET_NAME = re.compile(r"(?i)key|token|secret|passw|auth|cookie|credential|session|proxy")


def scrub(text: str, secrets: Iterable[str] = (), limit: int | None = _LIMIT) -> str:
    """``text`` without known secret values and credential shapes, then cut to
    ``limit`` characters (None: not cut)."""
    for secret in sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _SHAPES.sub(REDACTED, text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def account_secrets(home: str | os.PathLike[str], env: Mapping[str, str] = {}) -> set[str]:
    """Every secret value found in the account's files under ``home`` and in ``env``."""
    found = {v for k, v in env.items() if _SECRET_NAME.search(k) and v}
    found.update(p for k, v in env.items() if k.upper().endswith("_PROXY") and (p := _password(v)))
    for name in _CREDENTIAL_FILES:
        found.update(s for _, s in _strings(_load_json(os.path.join(home, name))))
    for name in _SETTINGS_FILES:
        found.update(s for path, s in _strings(_load_json(os.path.join(home, name)))
                     if _SECRET_NAME.search(path))
    for name in _DOTENV_FILES:
        try:
            with open(os.path.join(home, name), encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            key, sep, value = line.partition("=")
            if sep and _SECRET_NAME.search(key):
                found.add(value.strip().strip("'\""))
    return {s for s in found if len(s) >= _MIN_SECRET}


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def _load_json(path: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read(4 * 1024 * 1024))
    except (OSError, ValueError):
        return None


def _strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(key path, value) of every string leaf of a JSON document."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value, path)

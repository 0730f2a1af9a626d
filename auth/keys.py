"""Inbound API keys and the admin / metrics tokens.

Comparisons are constant time: presented and stored secrets are compared as
SHA-256 digests (equal length, so the length of a key does not leak) and every
configured key is compared, a match does not end the loop early.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ANONYMOUS", "extract_key", "extract_key_from_scope", "KeyRing", "TokenGate"]

ANONYMOUS = "anonymous"

_BEARER = "bearer "


def _from_authorization(value: str | None) -> str | None:
    if value and value[:7].lower() == _BEARER:
        return value[7:].strip() or None
    return None


def extract_key(headers: Mapping[str, str] | Iterable[tuple[bytes, bytes]]) -> str | None:
    """The client's key from ``Authorization: Bearer <k>`` or else ``x-api-key``.

    ``headers`` is a case-insensitive mapping (Starlette ``Headers``) or a raw
    ASGI header list.
    """
    if not isinstance(headers, Mapping):
        return _scan(headers)
    key = _from_authorization(headers.get("authorization"))
    if key is None:
        key = (headers.get("x-api-key") or "").strip() or None
    return key


def extract_key_from_scope(scope: Mapping[str, Any]) -> str | None:
    """``extract_key`` straight from ``scope["headers"]``, without building a ``Headers``."""
    return _scan(scope["headers"])


def _scan(raw: Iterable[tuple[bytes, bytes]]) -> str | None:
    # ASGI guarantees lower-cased header names.
    bearer = api_key = None
    for name, value in raw:
        if name == b"authorization":
            if bearer is None:
                bearer = _from_authorization(value.decode("latin-1"))
        elif name == b"x-api-key" and api_key is None:
            api_key = value.decode("latin-1").strip() or None
    return bearer if bearer is not None else api_key


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def _plain(secret: Any) -> str:
    # Accept pydantic SecretStr without importing pydantic here.
    return secret.get_secret_value() if hasattr(secret, "get_secret_value") else secret


class KeyRing:
    """The configured inbound keys, name -> secret. Empty means auth is off."""

    __slots__ = ("_entries",)

    def __init__(self, keys: Mapping[str, Any]) -> None:
        self._entries: tuple[tuple[str, bytes], ...] = tuple(
            (name, _digest(_plain(secret))) for name, secret in keys.items()
        )

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._entries)

    def identify(self, presented: str | None) -> str | None:
        """The name of the key presented, ``ANONYMOUS`` when auth is off, None when refused."""
        if not self._entries:
            return ANONYMOUS
        if presented is None:
            return None
        digest = _digest(presented)
        found = None
        for name, stored in self._entries:
            if hmac.compare_digest(digest, stored) and found is None:
                found = name
        return found

    def __repr__(self) -> str:
        return f"KeyRing(names={self.names!r})"


class TokenGate:
    """A single shared token (admin, metrics). Closed, refusing everyone, when no token is set."""

    __slots__ = ("_digest",)

    def __init__(self, token: Any) -> None:
        plain = _plain(token) if token is not None else None
        self._digest = _digest(plain) if plain else None

    @property
    def closed(self) -> bool:
        return self._digest is None

    def check(self, presented: str | None) -> bool:
        if self._digest is None or presented is None:
            return False
        return hmac.compare_digest(_digest(presented), self._digest)

    def __repr__(self) -> str:
        return f"TokenGate(closed={self.closed})"

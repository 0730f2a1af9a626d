"""Inbound API keys and the admin / metrics tokens.

Keys are found by the SHA-256 digest of the presented secret in a dict, so a
request costs the same with 10,000 keys as with one; what a lookup's timing
could reveal is about the digest, which says nothing useful about a secret.
The entry found is then compared in constant time. Keys added at run time are
stored (and handed here) as that digest only.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ANONYMOUS", "extract_key", "extract_key_from_scope", "extract_key_from_raw",
           "KeyRing", "TokenGate", "digest"]

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


def extract_key_from_raw(raw: Mapping[bytes, bytes]) -> str | None:
    """``extract_key`` from the raw headers as a dict (lower-case byte names,
    the first value of a repeated header)."""
    value = raw.get(b"authorization")
    key = _from_authorization(value.decode("latin-1")) if value is not None else None
    if key is None:
        value = raw.get(b"x-api-key")
        if value is not None:
            key = value.decode("latin-1").strip() or None
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


def digest(secret: str) -> bytes:
    """The SHA-256 digest a key is stored and looked up by."""
    return _digest(secret)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def _plain(secret: Any) -> str:
    # Accept pydantic SecretStr without importing pydantic here.
    return secret.get_secret_value() if hasattr(secret, "get_secret_value") else secret


class KeyRing:
    """The inbound keys, name -> secret digest and immutable id (a config
    key's id is its name). Empty means auth is off (unless ``required``:
    run-time keys may all be deleted, and the gateway must not open up then)."""

    __slots__ = ("_by_digest", "_by_name", "_ids", "_required")

    def __init__(self, keys: Mapping[str, Any], *, required: bool = False) -> None:
        self._by_digest: dict[bytes, str] = {}
        self._by_name: dict[str, bytes] = {}
        self._ids: dict[str, str] = {}
        self._required = required
        for name, secret in keys.items():
            self.add(name, _digest(_plain(secret)))

    @property
    def enabled(self) -> bool:
        return self._required or bool(self._by_name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def require(self) -> None:
        """Keep auth on from now on, even if every key is removed."""
        self._required = True

    def add(self, name: str, secret_digest: bytes, key_id: str | None = None) -> None:
        """Accept the key whose secret has ``secret_digest`` as ``name`` (replacing its old
        secret); ``key_id`` owns what it creates (default: the name). A secret another
        name holds is refused (ValueError naming only ``name``): one secret would
        otherwise identify as whichever name came last."""
        holder = self._by_digest.get(secret_digest)
        if holder is not None and holder != name:
            raise ValueError(f"key {name!r}: its secret is already another key's")
        self.remove(name)
        self._by_digest[secret_digest] = name
        self._by_name[name] = secret_digest
        if key_id is not None and key_id != name:
            self._ids[name] = key_id

    def remove(self, name: str) -> bool:
        """Refuse ``name`` from now on; False if it was not there."""
        old = self._by_name.pop(name, None)
        if old is None:
            return False
        del self._by_digest[old]
        self._ids.pop(name, None)
        return True

    def id_of(self, name: str) -> str:
        """The id of the key named ``name`` (a config key's, or anonymous: the name)."""
        return self._ids.get(name, name)

    def digest_of(self, name: str) -> bytes | None:
        return self._by_name.get(name)

    def knows_secret(self, secret_digest: bytes) -> bool:
        return secret_digest in self._by_digest

    def identify(self, presented: str | None) -> str | None:
        """The name of the key presented, ``ANONYMOUS`` when auth is off, None when refused."""
        if not self.enabled:
            return ANONYMOUS
        if presented is None:
            return None
        presented_digest = _digest(presented)
        name = self._by_digest.get(presented_digest)
        if name is None or not hmac.compare_digest(presented_digest, self._by_name[name]):
            return None
        return name

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

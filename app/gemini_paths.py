"""Which requests speak the Gemini API, and where their key is.

Gemini methods put the model in the path (``/v1beta/models/{model}:generateContent``),
so they cannot be found by the hot table's exact path: :func:`method_route`
names the table entry (``/v1beta/models/*:generateContent``) a path belongs
to. The google-genai SDK with a custom ``base_url`` may use ``/v1/`` as well:
there, the ``:method`` suffix (POSTs) or Google's key header (model listing)
tells a Gemini client from an OpenAI or Anthropic one.

A Gemini client sends its key as ``x-goog-api-key``, as ``?key=`` or as
``Authorization: Bearer``; the same key ring judges it as any other key.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import parse_qsl

__all__ = ["METHODS", "PREFIXES", "split_method_path", "method_route", "google_key",
           "wants_gemini"]

METHODS = frozenset(("generateContent", "streamGenerateContent", "countTokens"))
PREFIXES = ("/v1beta/models/", "/v1/models/")
GOOGLE_KEY_HEADER = b"x-goog-api-key"


def split_method_path(path: str) -> tuple[str, str, str] | None:
    """``(prefix, model, method)`` of a Gemini method path, else None. The
    model is what follows ``models/`` up to the last ``:`` (a model name may
    hold ``/`` or ``:`` itself)."""
    for prefix in PREFIXES:
        if path.startswith(prefix):
            model, sep, method = path[len(prefix):].rpartition(":")
            if sep and model and method in METHODS:
                return prefix, model, method
            return None
    return None


def method_route(path: str) -> str | None:
    """The hot table's path for a Gemini method path (``{prefix}*:{method}``)."""
    found = split_method_path(path)
    return f"{found[0]}*:{found[2]}" if found is not None else None


def wants_gemini(path: str, raw: Mapping[bytes, bytes]) -> bool:
    """A Gemini client's request: any ``/v1beta/`` path, a Gemini method under
    ``/v1/``, or a ``/v1/models`` listing that came with Google's key header."""
    if path.startswith("/v1beta/"):
        return True
    if path.startswith("/v1/models"):
        return GOOGLE_KEY_HEADER in raw or split_method_path(path) is not None
    return False


def google_key(raw: Mapping[bytes, bytes], scope: Mapping[str, Any]) -> str | None:
    """The key of ``x-goog-api-key``, else of ``?key=``."""
    value = raw.get(GOOGLE_KEY_HEADER)
    if value is not None:
        return value.decode("latin-1").strip() or None
    query = scope.get("query_string") or b""
    if b"key=" in query:
        for name, found in parse_qsl(query.decode("latin-1")):
            if name == "key":
                return found.strip() or None
    return None

"""Anthropic thinking carried through OpenAI Responses ``reasoning`` items.

A Responses client cannot hold an Anthropic thinking block's ``signature``
(or a ``redacted_thinking`` block's ``data``) anywhere but in the one opaque
field a reasoning item has, ``encrypted_content``; and Anthropic refuses a
tool-use continuation with thinking on unless the signed block comes back
as it was. So the encoder writes it there, tagged (``anthropic-thinking:``
or ``anthropic-redacted:`` + the value; a colon is in neither base64 nor
OpenAI's own encrypted reasoning), and the decoder takes it back out, byte
for byte. Pure.
"""

from __future__ import annotations

__all__ = ["carried", "uncarried"]

_SIGNED = "anthropic-thinking:"
_REDACTED = "anthropic-redacted:"


def carried(signature: str | None, redacted: str | None, encrypted: str | None) -> str | None:
    """The ``encrypted_content`` of a reasoning item for these opaque values."""
    if encrypted is not None:
        return encrypted
    if redacted is not None:
        return _REDACTED + redacted
    if signature is not None:
        return _SIGNED + signature
    return None


def uncarried(encrypted: str | None) -> tuple[str | None, str | None, str | None]:
    """(signature, redacted data, OpenAI encrypted content) of an ``encrypted_content``."""
    if encrypted is not None:
        if encrypted.startswith(_SIGNED):
            return encrypted[len(_SIGNED):], None, None
        if encrypted.startswith(_REDACTED):
            return None, encrypted[len(_REDACTED):], None
    return None, None, encrypted

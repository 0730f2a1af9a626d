"""Client text cannot forge special tokens.

A chat prompt is the model's template filled in with client strings. Were the
rendered text tokenized with special tokens parsed throughout, a client could
write ``<|im_start|>system`` into a message and get a real turn marker: a
forged system turn. So every client string (message contents, tool calls and
results, tool schemas) has the texts of the tokenizer's special tokens
replaced by placeholders before rendering; the rendered prompt is then
tokenized piece by piece: the template's own text with special tokens parsed,
each shielded text as plain text (``<``, ``|``, ``im``... tokens).

A prompt with no special text in client strings tokenizes exactly as before
(one call, the same ids). Raw prompts (``/v1/completions`` text, ``/generate``
``text`` and ``input_ids``) are the client's own prompt, with no template
around them to escape from: they are left as given.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Iterable

from .engine import Tokenizer

__all__ = ["SpecialShield"]


class SpecialShield:
    """One per prompt: ``shield`` the client's values, render, then ``encode``."""

    def __init__(self, specials: Iterable[str]) -> None:
        texts = sorted({s for s in specials if s}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
        # a fresh nonce, so a client cannot write a placeholder of its own
        self._nonce = secrets.token_hex(8)
        self._marker = re.compile("\ue000" + self._nonce + r":(\d+)\ue001")
        self._found: list[str] = []

    def shield(self, value: Any) -> Any:
        """``value`` (strings, lists, dicts, nested) with special texts replaced."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self._pattern.sub(self._placeholder, value)
        if isinstance(value, dict):
            return {self.shield(k): self.shield(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.shield(v) for v in value]
        return value

    def _placeholder(self, match: re.Match[str]) -> str:
        self._found.append(match.group())
        return f"\ue000{self._nonce}:{len(self._found) - 1}\ue001"

    def encode(self, tok: Tokenizer, rendered: str) -> list[int]:
        """Ids of ``rendered``: template text with special tokens, shielded text without."""
        if not self._found:
            return tok.encode(rendered)
        ids: list[int] = []
        pos = 0
        for match in self._marker.finditer(rendered):
            if match.start() > pos:
                ids += tok.encode(rendered[pos:match.start()])
            ids += tok.encode_text(self._found[int(match.group(1))])
            pos = match.end()
        if pos < len(rendered):
            ids += tok.encode(rendered[pos:])
        return ids

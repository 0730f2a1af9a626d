"""Tell an OpenAI text chunk by its bytes, without parsing it (sans-IO).

Within one stream, an upstream's plain text chunks differ only in their text:
``{"id":..,"created":..,"model":..,"choices":[{"index":0,"delta":{"content":"<text>"},
"logprobs":null,"finish_reason":null}]}``. :class:`TextChunkShape` learns the
text before and after the content string from one such chunk that the parser
did parse, and then reads the text of any chunk made of the same two parts
around one JSON string without a full parse: the same parts around another
string token parse to the same object but for that string (JSON's grammar is
context-free), so the parser's answer cannot differ.

A shape is only taken after a probe: the learnt parts around another string
must parse to the parsed chunk with only its content replaced (this rules out
a ``"content":`` found inside a key or a duplicate key). A server whose chunks
vary in other fields (a per-chunk timestamp or padding) never matches; after a
few tries the parser stops learning.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["TextChunkShape"]

_KEYS = ('"content":', '"content": ')
_PROBE = "poolgate-probe"
_TRIES = 3


class TextChunkShape:
    """The two parts around the content string of a stream's text chunks."""

    __slots__ = ("prefix", "suffix", "_start", "_end", "_tries")

    def __init__(self) -> None:
        self.prefix: str | None = None  # None: nothing learnt (or given up)
        self.suffix = ""
        self._start = 0   # where the content string starts: len(prefix)
        self._end = -1    # where it ends, from the end: -len(suffix) (never empty)
        self._tries = _TRIES

    def text(self, data: str) -> str | None:
        """The content of ``data`` when it is a chunk of the learnt shape, else ``None``."""
        prefix = self.prefix
        if prefix is None or not data.startswith(prefix) or not data.endswith(self.suffix):
            return None
        try:
            text = orjson.loads(data[self._start:self._end])
        except orjson.JSONDecodeError:
            return None
        return text if type(text) is str else None

    def learn(self, data: str, chunk: dict[str, Any], content: Any) -> None:
        """Learn the shape of ``data``, which parsed to ``chunk``: one choice whose
        delta holds only ``content``. Forgets the old shape (it did not match)."""
        self.prefix = None
        if self._tries <= 0 or type(content) is not str:
            return
        self._tries -= 1
        literal = orjson.dumps(content).decode()
        for key in _KEYS:
            at = data.find(key + literal)
            if at >= 0 and data.find(key + literal, at + 1) < 0:
                cut = at + len(key)
                prefix, suffix = data[:cut], data[cut + len(literal):]
                if suffix and _same_but_content(prefix + orjson.dumps(_PROBE).decode() + suffix,
                                                chunk, content):
                    self.prefix, self.suffix = prefix, suffix
                    self._start, self._end = len(prefix), -len(suffix)
                return


def _same_but_content(probe: str, chunk: dict[str, Any], content: str) -> bool:
    try:
        parsed = orjson.loads(probe)
        delta = parsed["choices"][0]["delta"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False
    if delta != {"content": _PROBE}:
        return False
    delta["content"] = content
    return bool(parsed == chunk)

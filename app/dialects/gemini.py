"""The Gemini API client dialect (``models/{model}:generateContent``,
``:streamGenerateContent``, ``:countTokens``).

Decoding lives in :mod:`app.dialects.gemini_decode`, encoding in
:mod:`app.dialects.gemini_encode`; this module is the one surface routes
import. :data:`ARRAY` is the same dialect with the stream written as one JSON
array (``streamGenerateContent`` without ``?alt=sse``).
"""

from __future__ import annotations

from types import SimpleNamespace

from .gemini_decode import decode, decode_count_tokens
from .gemini_encode import ArrayStreamEncoder, StreamEncoder, encode_completion

__all__ = ["decode", "decode_count_tokens", "encode_completion", "StreamEncoder", "ARRAY"]

#: not ``forwards``: a same-dialect upstream's SSE frames are translated into the array
ARRAY = SimpleNamespace(encode_completion=encode_completion, StreamEncoder=ArrayStreamEncoder,
                        forwards=False)

"""The OpenAI Chat Completions dialect (``POST /v1/chat/completions``).

Decoding lives in :mod:`app.dialects.openai_chat_decode`, encoding in
:mod:`app.dialects.openai_chat_encode`; this module is the dialect's one face.
"""

from __future__ import annotations

from .openai_chat_decode import decode
from .openai_chat_encode import StreamEncoder, encode_completion

__all__ = ["decode", "encode_completion", "StreamEncoder"]

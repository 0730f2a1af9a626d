"""The Anthropic ``POST /v1/messages`` client dialect.

Decoding lives in :mod:`app.dialects.anthropic_decode`, encoding (JSON body and
SSE stream) in :mod:`app.dialects.anthropic_encode`; this module is the one
surface routes import.
"""

from __future__ import annotations

from .anthropic_decode import decode, decode_count_tokens
from .anthropic_encode import StreamEncoder, encode_completion, stop_reason, usage_fields

__all__ = ["decode", "decode_count_tokens", "encode_completion", "StreamEncoder",
           "stop_reason", "usage_fields"]

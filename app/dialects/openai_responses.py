"""The OpenAI Responses dialect (``POST /v1/responses``).

Decoding lives in :mod:`app.dialects.openai_responses_decode`, encoding in
:mod:`app.dialects.openai_responses_encode`; this module is the dialect's one face.
"""

from __future__ import annotations

from .openai_responses_decode import NAMESPACE_SEPARATOR, decode, input_items
from .openai_responses_encode import StreamEncoder, encode_completion
from .openai_responses_refs import references, resolve

__all__ = ["decode", "input_items", "encode_completion", "StreamEncoder", "NAMESPACE_SEPARATOR",
           "references", "resolve"]

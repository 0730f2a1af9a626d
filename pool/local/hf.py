"""Hugging Face tokenizers: the :class:`~pool.local.engine.Tokenizer` of an HF
model folder (or hub id), for the Transformers engine and for the engines that
serve HF folders from another process (vLLM, SGLang)."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from .template import ChatTemplate

__all__ = ["HFTokenizer"]


class HFTokenizer:
    """``tokenizers`` underneath; the chat template rendered by :class:`ChatTemplate`."""

    def __init__(self, tokenizer: Any, template: ChatTemplate | None, eos_ids: frozenset[int]) -> None:
        self._tok = tokenizer  # a transformers PreTrainedTokenizerFast
        self._template = template
        self.eos_ids = eos_ids
        self._bytes: dict[int, bytes] = {}
        self.vocab_size = len(tokenizer)
        self.special_texts = frozenset(t.content for t in tokenizer.added_tokens_decoder.values()
                                       if t.special)

    @classmethod
    def from_pretrained(cls, path: str, *, chat_template: str | None = None,
                        extra_eos: Sequence[str] = ()) -> "HFTokenizer":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        source = chat_template or getattr(tok, "chat_template", None)
        if isinstance(source, dict):  # several named templates: the default one
            source = source.get("default")
        template = None
        if source:
            template = ChatTemplate(source, bos_token=tok.bos_token or "", eos_token=tok.eos_token or "")
        eos: set[int] = set()
        if tok.eos_token_id is not None:
            eos.add(tok.eos_token_id)
        for name in ("generation_config.json", "config.json"):
            file = os.path.join(path, name)
            if os.path.isfile(file):
                with open(file) as fh:
                    ids = json.load(fh).get("eos_token_id")
                eos.update(ids if isinstance(ids, list) else [ids] if isinstance(ids, int) else [])
        for text in extra_eos:
            eos.add(tok.convert_tokens_to_ids(text))
        return cls(tok, template, frozenset(eos))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def encode_text(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False, split_special_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._bytes.get(token_id)
        if piece is None:
            piece = self._bytes[token_id] = self._piece(token_id)
        return piece

    def _piece(self, token_id: int) -> bytes:
        token = self._tok.convert_ids_to_tokens(token_id)
        if token is None:
            return b""
        if token in self._tok.get_added_vocab():
            return token.encode()
        backend = self._tok.backend_tokenizer
        decoder = type(backend.decoder).__name__ if backend.decoder is not None else ""
        if decoder == "ByteLevel":
            return bytes(_byte_decoder()[c] for c in token)
        # sentencepiece-style: "▁" is a space, <0xNN> a raw byte
        if token.startswith("<0x") and token.endswith(">") and len(token) == 6:
            return bytes([int(token[3:5], 16)])
        return token.replace("\u2581", " ").encode()

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def render_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                    add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ValueError("this model has no chat template; send a prompt instead of messages")
        return self._template.render(messages, tools, add_generation_prompt)


_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
            + list(range(ord("®"), ord("ÿ") + 1))
        chars = keep[:]
        n = 0
        for b in range(256):
            if b not in keep:
                keep.append(b)
                chars.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(keep, chars)}
    return _BYTE_DECODER

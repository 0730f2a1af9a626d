"""llama.cpp's tokens for the ``llamacpp`` engine (:mod:`pool.local.llamacpp`):
:class:`LlamaCppTokenizer` (llama.cpp's own tokenizer over the embedded server,
the GGUF's vocabulary and chat template) and :class:`_StreamDecoder`, which
turns llama-server's native stream chunks into steps and rebuilds the tokens
llama.cpp withholds mid-character (the engine module's documentation says how
and why)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .engine import GenParams, Step
from .ggufmeta import BYTE as _BYTE
from .ggufmeta import CONTROL as _CONTROL
from .ggufmeta import NORMAL as _NORMAL
from .ggufmeta import UNKNOWN as _UNKNOWN
from .ggufmeta import UNUSED as _UNUSED
from .ggufmeta import GGUFMetadata
from .template import ChatTemplate

if TYPE_CHECKING:
    from .llamacpp import _Http

__all__ = ["LlamaCppTokenizer"]

log = logging.getLogger("pool.local.llamacpp")  # the engine's log

#: the most withheld tokens in a row rebuilt (more is a degenerate byte soup)
_MAX_WITHHELD = 256


# --- the tokenizer ------------------------------------------------------------------------------

class LlamaCppTokenizer:
    """llama.cpp's tokenizer (over the embedded server) and the GGUF's vocabulary
    and chat template.

    ``token_bytes`` follows llama.cpp's ``token_to_piece`` for ordinary tokens
    (byte-level BPE decoded to raw bytes, SentencePiece ``▁`` as a space and
    ``<0xNN>`` as the byte) and gives the text of control tokens, as Hugging
    Face's tokenizers do; ``special_ids`` are the tokens llama.cpp itself never
    renders as text (control, unknown, unused and end-of-generation tokens)."""

    def __init__(self, meta: GGUFMetadata, *, eos_ids: frozenset[int],
                 chat_template: str | None = None, server: "_Http | None" = None) -> None:
        self.meta = meta
        self.vocab_size = len(meta.tokens)
        self.eos_ids = eos_ids
        types = meta.token_types
        self.special_ids = frozenset(i for i, t in enumerate(types)
                                     if t in (_CONTROL, _UNKNOWN, _UNUSED)) | eos_ids
        self.special_texts = frozenset(meta.tokens[i] for i, t in enumerate(types)
                                       if t == _CONTROL)
        self._server = server
        self._bytes: dict[int, bytes] = {}
        self._index: dict[bytes, list[int]] | None = None
        self._max_piece = 0
        source = chat_template or meta.chat_template
        self._template: ChatTemplate | None = None
        if source:
            tokens = meta.tokens
            bos = tokens[meta.bos_id] if meta.bos_id is not None else ""
            eos = tokens[meta.eos_id] if meta.eos_id is not None else ""
            self._template = ChatTemplate(source, bos_token=bos, eos_token=eos)
        self._byte_level = meta.tokenizer_model == "gpt2"
        self._spm = meta.tokenizer_model in ("llama", "t5")

    # --- Tokenizer protocol -------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._tokenize(text, parse_special=True)

    def encode_text(self, text: str) -> list[int]:
        return self._tokenize(text, parse_special=False)

    def _tokenize(self, text: str, *, parse_special: bool) -> list[int]:
        if not text:
            return []
        if self._server is None:
            raise RuntimeError("the llama.cpp server is not running")
        body = self._server.post("/tokenize", {"content": text, "add_special": False,
                                               "parse_special": parse_special})
        return [int(t) for t in body["tokens"]]

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._bytes.get(token_id)
        if piece is None:
            piece = self._bytes[token_id] = self._piece(token_id)
        return piece

    def render_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                    add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ValueError("this model has no chat template; send a prompt instead of messages")
        return self._template.render(messages, tools, add_generation_prompt)

    # --- helpers --------------------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", "replace")

    def llama_piece(self, token_id: int) -> bytes:
        """The bytes llama-server streams for a token: nothing for the special ones."""
        if token_id in self.special_ids:
            return b""
        return self.token_bytes(token_id)

    def _piece(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            return b""
        text = self.meta.tokens[token_id]
        kind = self.meta.token_types[token_id]
        if kind == _NORMAL:
            if self._byte_level:
                decoder = _byte_decoder()
                out = bytearray()
                for ch in text:
                    b = decoder.get(ch)
                    if b is None:
                        out += ch.encode("utf-8", "surrogateescape")
                    else:
                        out.append(b)
                return bytes(out)
            if self._spm:
                return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
        elif kind == _BYTE and text.startswith("<0x") and text.endswith(">") and len(text) == 6:
            return bytes([int(text[3:5], 16)])
        return text.encode("utf-8", "surrogateescape")

    def pieces_index(self) -> tuple[dict[bytes, list[int]], int]:
        """Non-empty streamed pieces to the ids spelling them, and the longest piece's length."""
        if self._index is None:
            index: dict[bytes, list[int]] = {}
            longest = 0
            for i in range(self.vocab_size):
                piece = self.llama_piece(i)
                if piece:
                    index.setdefault(piece, []).append(i)
                    longest = max(longest, len(piece))
            self._index, self._max_piece = index, longest
        return self._index, self._max_piece


_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        from .hf import _byte_decoder as gpt2_alphabet

        _BYTE_DECODER = gpt2_alphabet()
    return _BYTE_DECODER


# --- the stream -----------------------------------------------------------------------------------

def _cut_char(text: bytes) -> bool:
    """llama-server's ``validate_utf8`` test: does ``text`` end inside a UTF-8 character?"""
    n = len(text)
    for i in range(1, min(4, n) + 1):
        c = text[n - i]
        if (c & 0xE0) == 0xC0:
            if i < 2:
                return True
        elif (c & 0xF0) == 0xE0:
            if i < 3:
                return True
        elif (c & 0xF8) == 0xF0:
            if i < 4:
                return True
    return False


class _StreamDecoder:
    """Turns llama-server's native stream chunks into steps, rebuilding the
    tokens it did not send (see the module's documentation)."""

    def __init__(self, tokenizer: LlamaCppTokenizer, params: GenParams, eog_fallback: int | None) -> None:
        self.tok = tokenizer
        self.logprobs = params.logprobs
        self.top = params.top_logprobs
        self.eog_fallback = eog_fallback
        self.count = 0          # tokens accounted for (steps made)
        self.tail = b""         # the last bytes llama.cpp sent (for the cut-character test)
        self.lost = 0           # tokens that could not be rebuilt
        self.cache_told = False  # the prompt's cached tokens reported (on the first step)

    def feed(self, chunk: dict[str, Any]) -> list[Step]:
        ids = [int(t) for t in chunk.get("tokens") or ()]
        predicted = chunk.get("tokens_predicted")
        if chunk.get("stop"):
            return self._final(chunk, predicted)
        if not ids:
            return []
        steps: list[Step] = []
        gap = predicted - self.count - len(ids) if isinstance(predicted, int) else 0
        probs = chunk.get("completion_probabilities") or ()
        if len(probs) == 1 and len(ids) == 1 and isinstance(probs[0].get("bytes"), list):
            text = bytes(probs[0]["bytes"])
        else:
            text = str(chunk.get("content") or "").encode("utf-8", "surrogateescape")
        if gap > 0:
            steps.extend(self._rebuild(text, ids, gap))
        for i, token in enumerate(ids):
            entry = probs[i] if i < len(probs) and isinstance(probs[i], dict) else None
            steps.append(self._step(token, entry))
        self.count += len(ids)
        self.tail = (self.tail + text)[-3:]
        if not self.cache_told and steps:
            self.cache_told = True
            cached = (chunk.get("timings") or {}).get("cache_n")
            if isinstance(cached, int):
                steps[0] = replace(steps[0], cached_prompt=cached)
        return steps

    def _step(self, token: int, entry: dict[str, Any] | None) -> Step:
        if entry is None or not (self.logprobs or self.top):
            return Step(token)
        logprob = entry.get("logprob") if self.logprobs else None
        top: tuple[tuple[int, float], ...] = ()
        if self.top:
            top = tuple((int(t["id"]), float(t["logprob"]) if t.get("logprob") is not None
                         else float("-inf")) for t in (entry.get("top_logprobs") or ())[:self.top])
        return Step(token, float(logprob) if logprob is not None else None, top)

    def _rebuild(self, text: bytes, ids: list[int], gap: int) -> list[Step]:
        known = b"".join(self.tok.llama_piece(t) for t in ids)
        if not text.endswith(known):
            return self._give_up(gap, "the chunk's text does not end with its tokens")
        prefix = text[:len(text) - len(known)]
        split = _split(prefix, gap, self.tail, *self.tok.pieces_index())
        if split is None:
            return self._give_up(gap, f"no split of {prefix!r} into {gap} tokens")
        self.count += gap
        return [Step(t) for t in split]

    def _give_up(self, gap: int, why: str) -> list[Step]:
        log.warning("llamacpp: %d token(s) llama.cpp did not stream could not be rebuilt: %s", gap, why)
        self.lost += gap
        self.count += gap
        return []

    def _final(self, chunk: dict[str, Any], predicted: Any) -> list[Step]:
        if not isinstance(predicted, int) or predicted <= self.count:
            return []
        gap = predicted - self.count
        self.count = predicted
        if chunk.get("stop_type") == "eos" and self.eog_fallback is not None:
            # the sequence ended on an EOG token right after a cut character: llama.cpp
            # sent neither (their bytes are gone); the EOG step is what matters
            if gap > 1:
                self.lost += gap - 1
                log.warning("llamacpp: %d token(s) before the end were not streamed by llama.cpp",
                            gap - 1)
            return [Step(self.eog_fallback)]
        self.lost += gap
        return []


def _split(prefix: bytes, n: int, tail: bytes, index: dict[bytes, list[int]],
           longest: int) -> list[int] | None:
    """``prefix`` as exactly ``n`` tokens, each ending inside a UTF-8 character
    (llama.cpp withheld every one of them); the longest tokens first when
    several splits fit. None when there is no such split (or it is absurdly long)."""
    size = len(prefix)
    if size == 0 or n > size or n > _MAX_WITHHELD:
        return None
    cut = [False] * (size + 1)
    for j in range(1, size + 1):
        cut[j] = _cut_char(tail + prefix[:j])
    dead: set[tuple[int, int]] = set()

    def search(pos: int, left: int) -> list[int] | None:
        if left == 0:
            return [] if pos == size else None
        if (pos, left) in dead or size - pos < left:
            return None
        for end in range(min(size, pos + longest), pos, -1):
            if not cut[end]:
                continue
            ids = index.get(prefix[pos:end])
            if not ids:
                continue
            rest = search(end, left - 1)
            if rest is not None:
                return [ids[0], *rest]
        dead.add((pos, left))
        return None

    return search(0, n)

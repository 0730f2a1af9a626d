"""A fake SGLang server: SGLang's native HTTP API over a deterministic toy
"model", for testing :class:`pool.local.sglang.SGLangEngine` where SGLang
itself cannot run (it has no CPU build).

Run it the way SGLang is run::

    python -m tests.fakes.sglang_server --model-path DIR --host 127.0.0.1 --port P [options]

It speaks what SGLang 0.5 documents and does (``sglang/srt/entrypoints/
http_server.py``, ``managers/io_struct.py``, ``sampling/sampling_params.py``):

* ``GET /health`` and ``GET /health_generate``: 503 while starting, then 200;
* ``GET /get_model_info`` (and ``/model_info``), ``GET /v1/models`` (with
  ``max_model_len``);
* ``POST /generate`` with ``text`` or ``input_ids``, ``sampling_params``,
  ``return_logprob``, ``top_logprobs_num``, ``logprob_start_len``, ``stream``,
  ``rid``...: unknown request keys and unknown sampling parameters are refused
  with 400 as SGLang's request contract does. Without ``stream`` the answer is
  one JSON object; with it, ``data: {json}`` events ending ``data: [DONE]``,
  each carrying *all* ``output_ids`` and ``meta_info`` logprob lists so far
  (SGLang's default), or only the new ones with
  ``--incremental-streaming-output`` (SGLang's flag of that name).

The "model": after token ``t`` the candidates are ``g, g+1, g+2, ...``
(mod the vocabulary) with ``g = (t*31 + 7) % vocab`` and logprobs ``-0.5,
-1.5, -2.5, ...``; greedy takes ``g``, sampling picks among the first four
with those weights, from ``random.Random(sampling_seed)`` when the server runs
with ``--enable-deterministic-inference`` (as SGLang honours ``sampling_seed``
only then) and from an unseeded generator otherwise. It stops after
``max_new_tokens`` and, unless ``ignore_eos`` (which in SGLang turns off every
token-based stop), at a token in ``stop_token_ids`` or an EOS id of the model
folder's ``config.json``.

Test hooks (not SGLang's): ``--startup-delay S`` (503 from the health checks for
S seconds), ``--token-delay S`` (a pause before each streamed token),
``--crash-after S`` (print a traceback and exit 3 after S seconds, before
becoming ready), ``--control FILE`` (a JSON object read at each ``/generate``,
so a test can make a running server misbehave: ``{"status": N}`` answers N,
``{"abort": N}`` aborts the request with status N before its first token as
SGLang does, ``{"break": true}`` drops the connection mid-stream before the
first token, ``{"hang": true}`` starts the stream and then sends nothing),
``GET /_fake/requests`` (every ``/generate`` body with what
became of it: ``tokens_sent``, ``finished``, ``disconnected``), ``GET
/_fake/info`` (argv and the SGLANG_* environment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from typing import Any

from aiohttp import web

# SGLang's GenerateReqInput fields a client may send (io_struct.py), and
# SamplingParams' API fields (sampling_params.py)
REQUEST_KEYS = frozenset({
    "text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data",
    "sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num",
    "token_ids_logprob", "return_text_in_logprobs", "stream", "log_metrics",
    "return_hidden_states", "modalities", "lora_path", "lora_id", "custom_logit_processor",
    "bootstrap_host", "bootstrap_port", "bootstrap_room", "data_parallel_rank", "background",
    "return_flat_raw_top_logprobs", "return_flat_raw_output_top_logprobs",
    "return_flat_raw_top_logprobs_b64", "return_sampling_mask", "sampling_logprobs_mode",
    "priority", "extra_key", "no_logs",
})
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "beam_width", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
    "logit_bias", "sampling_seed", "custom_params", "watermark",
})
CANDIDATES = 8  # how many alternatives the toy model knows at each step


class FakeModel:
    def __init__(self, vocab: int, eos_ids: frozenset[int]) -> None:
        self.vocab = vocab
        self.eos_ids = eos_ids

    def candidates(self, prev: int) -> list[tuple[int, float]]:
        g = (prev * 31 + 7) % self.vocab
        return [((g + j) % self.vocab, -0.5 - j) for j in range(CANDIDATES)]

    def pick(self, prev: int, temperature: float, rng: random.Random) -> tuple[int, float]:
        cands = self.candidates(prev)
        if temperature <= 1e-5:
            return cands[0]
        pool = cands[:4]
        weights = [math.exp(lp / temperature) for _, lp in pool]
        return rng.choices(pool, weights)[0]


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        vocab, eos, ctx = 4096, frozenset(), 4096
        config = os.path.join(args.model_path, "config.json")
        if os.path.isfile(config):
            with open(config) as fh:
                cfg = json.load(fh)
            vocab = int(cfg.get("vocab_size", vocab))
            raw = cfg.get("eos_token_id")
            eos = frozenset(raw if isinstance(raw, list) else [raw] if isinstance(raw, int) else [])
            ctx = int(cfg.get("max_position_embeddings", ctx))
        self.model = FakeModel(vocab, eos)
        self.context_length = args.context_length or ctx
        self.requests: list[dict[str, Any]] = []
        self.helper: int | None = None

    # -- lifecycle -------------------------------------------------------------------

    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.args.startup_delay

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready() else 503)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.args.model_path, "tokenizer_path": self.args.model_path,
            "served_model_name": self.args.served_model_name or self.args.model_path,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default", "model_type": "fake", "architectures": ["FakeForCausalLM"],
        })

    async def models(self, request: web.Request) -> web.Response:
        name = self.args.served_model_name or self.args.model_path
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "owned_by": "sglang", "root": name,
            "max_model_len": self.context_length}]})

    async def fake_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def fake_info(self, request: web.Request) -> web.Response:
        return web.json_response({"argv": sys.argv[1:], "pid": os.getpid(), "helper": self.helper,
                                  "env": {k: v for k, v in os.environ.items() if k.startswith("SGLANG")}})

    # -- /generate ---------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if not self.ready():
            return _error(503, "The server is not ready")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        record: dict[str, Any] = {"body": body, "tokens_sent": 0, "finished": False,
                                  "disconnected": False}
        self.requests.append(record)
        fault = self._fault()
        if fault.get("status"):
            record["error"] = "injected"
            return _error(int(fault["status"]), "fake sglang: injected failure")
        problem = self._check(body)
        if problem:
            record["error"] = problem
            return _error(400, problem)
        sp = dict(body.get("sampling_params") or {})
        ids = body.get("input_ids")
        if ids is None:
            ids = [ord(c) % self.model.vocab for c in body.get("text", "")]
        max_new = int(sp.get("max_new_tokens", 16) if sp.get("max_new_tokens") is not None else 16)
        if len(ids) + max_new > self.context_length:
            message = (f"Requested token count exceeds the model's maximum context length of "
                       f"{self.context_length} tokens. You requested a total of {len(ids) + max_new} "
                       f"tokens: {len(ids)} tokens from the input messages and {max_new} tokens "
                       f"for the completion.")
            record["error"] = message
            return _error(400, message)
        temperature = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
        seed = sp.get("sampling_seed")
        rng = random.Random(seed) if seed is not None and self.args.enable_deterministic_inference \
            else random.Random()
        # as SGLang's Req._check_token_based_finish: ignore_eos turns off every
        # token-based stop, stop_token_ids included
        stops = set() if sp.get("ignore_eos") else set(sp.get("stop_token_ids") or ()) | self.model.eos_ids
        want_lp = bool(body.get("return_logprob"))
        top_n = int(body.get("top_logprobs_num") or 0) if want_lp else 0
        rid = body.get("rid") or f"fake-{len(self.requests)}"

        out_ids: list[int] = []
        lps: list[list[Any]] = []
        tops: list[list[list[Any]]] = []
        state = {"finish": None}
        prev = ids[-1] if ids else 0

        def step() -> None:
            nonlocal prev
            tid, lp = self.model.pick(prev, temperature, rng)
            out_ids.append(tid)
            lps.append([lp, tid, None])
            tops.append([[l, t, None] for t, l in self.model.candidates(prev)[:top_n]])
            prev = tid
            if tid in stops:
                state["finish"] = {"type": "stop", "matched": tid}
            elif len(out_ids) >= max_new:
                state["finish"] = {"type": "length", "length": max_new}

        def meta(first: int) -> dict[str, Any]:
            m: dict[str, Any] = {"id": rid, "finish_reason": state["finish"], "prompt_tokens": len(ids),
                                 "completion_tokens": len(out_ids), "cached_tokens": 0}
            if want_lp:
                m["input_token_logprobs"] = []
                m["output_token_logprobs"] = lps[first:]
                m["output_token_logprobs_length"] = len(lps)
                if top_n:
                    m["input_top_logprobs"] = []
                    m["output_top_logprobs"] = tops[first:]
            return m

        if not body.get("stream"):
            while state["finish"] is None:
                step()
            record["tokens_sent"] = len(out_ids)
            record["finished"] = True
            return web.json_response({"text": " ".join(map(str, out_ids)), "output_ids": out_ids,
                                      "meta_info": meta(0)})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        incremental = self.args.incremental_streaming_output
        if fault:
            return await self._misbehave(fault, request, resp, rid)
        try:
            while state["finish"] is None:
                if self.args.token_delay:
                    await asyncio.sleep(self.args.token_delay)
                first = len(out_ids)
                step()
                if incremental:
                    chunk = {"text": f" {out_ids[-1]}", "output_ids": out_ids[first:], "meta_info": meta(first)}
                else:
                    chunk = {"text": " ".join(map(str, out_ids)), "output_ids": list(out_ids),
                             "meta_info": meta(0)}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                record["tokens_sent"] = len(out_ids)
            await resp.write(b"data: [DONE]\n\n")
            record["finished"] = True
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            record["disconnected"] = True
            print(f"[http_server] Client disconnected: abort request {rid}", flush=True)
            raise
        return resp

    def _fault(self) -> dict[str, Any]:
        path = self.args.control
        if path is None or not os.path.exists(path):
            return {}
        with open(path) as fh:
            text = fh.read()
        return json.loads(text) if text.strip() else {}

    async def _misbehave(self, fault: dict[str, Any], request: web.Request,
                         resp: web.StreamResponse, rid: str) -> web.StreamResponse:
        if fault.get("abort"):
            finish = {"type": "abort", "message": "fake sglang: injected abort",
                      "status_code": int(fault["abort"])}
            chunk = {"text": "", "output_ids": [], "meta_info": {
                "id": rid, "finish_reason": finish, "completion_tokens": 0}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if fault.get("break"):
            await resp.write(b'data: {"output_ids": [')
            assert request.transport is not None
            request.transport.abort()
            return resp
        await asyncio.sleep(3600)  # "hang": the stream is open and nothing comes
        return resp

    def _check(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "the request must be a JSON object"
        unknown = set(body) - REQUEST_KEYS
        if unknown:
            return f"unknown field(s) in the request: {sorted(unknown)}"
        if (body.get("text") is None) == (body.get("input_ids") is None):
            return "Either text or input_ids should be provided."
        ids = body.get("input_ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            return "input_ids must be a list of integers"
        if ids is not None and any(not 0 <= i < self.model.vocab for i in ids):
            return "input_ids out of the vocabulary"
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            return "sampling_params must be an object"
        unknown = set(sp) - SAMPLING_KEYS
        if unknown:
            return f"SamplingParams got unexpected keyword argument(s) {sorted(unknown)}"
        top_k = sp.get("top_k", -1)
        if top_k is not None and (top_k < 1 and top_k != -1):
            return f"top_k must be -1 (disable) or at least 1, got {top_k}."
        temperature = sp.get("temperature")
        if temperature is not None and (not math.isfinite(temperature) or temperature < 0):
            return f"temperature must be a non-negative finite number, got {temperature}."
        top_p = sp.get("top_p")
        if top_p is not None and not 0 < top_p <= 1:
            return f"top_p must be in (0, 1], got {top_p}."
        seed = sp.get("sampling_seed")
        if seed is not None and not isinstance(seed, int):
            return f"sampling_seed must be an integer, got {type(seed).__name__}."
        if body.get("top_logprobs_num") not in (None, 0) and not body.get("return_logprob"):
            return None  # SGLang ignores it then
        return None


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": "BadRequestError"
                              if status == 400 else "ServiceUnavailableError", "param": None,
                              "code": status}, status=status)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--enable-deterministic-inference", action="store_true")
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--crash-after", type=float, default=None)
    p.add_argument("--spawn-helper", action="store_true")
    p.add_argument("--control", default=None)
    args, unknown = p.parse_known_args(argv)
    args.unknown = unknown
    return args


async def _crash(delay: float) -> None:
    await asyncio.sleep(delay)
    print("Traceback (most recent call last):", flush=True)
    print('  File "sglang/srt/model_executor/model_runner.py", line 1, in load_model', flush=True)
    print("RuntimeError: fake sglang crashed while loading the model", file=sys.stderr, flush=True)
    os._exit(3)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("the fake sglang server binds loopback only")
    server = Server(args)
    if args.spawn_helper:
        import subprocess

        server.helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    app = web.Application()
    app.router.add_get("/health", server.health)
    app.router.add_get("/health_generate", server.health)
    app.router.add_get("/get_model_info", server.model_info)
    app.router.add_get("/model_info", server.model_info)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/generate", server.generate)
    app.router.add_get("/_fake/requests", server.fake_requests)
    app.router.add_get("/_fake/info", server.fake_info)

    async def on_startup(app: web.Application) -> None:
        if args.crash_after is not None:
            app["crash"] = asyncio.create_task(_crash(args.crash_after))

    app.on_startup.append(on_startup)
    print(f"server_args: model_path={args.model_path} port={args.port} "
          f"context_length={server.context_length} unknown={args.unknown}", flush=True)
    print("The server is fired up and ready to roll!", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None,
                handle_signals=True, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()

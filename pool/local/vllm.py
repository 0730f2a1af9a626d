"""The vLLM engine: a vLLM OpenAI-compatible server run as a subprocess of the
worker child, spoken to over loopback HTTP so that token ids and logprobs come
back exactly (no re-tokenisation of text).

The server is started as ``python -m vllm.entrypoints.openai.api_server`` with
the interpreter of an environment that has vLLM (``python=``; vLLM pins its own
torch, so it usually lives in a venv of its own). It binds 127.0.0.1 only and
runs in a process group of its own under a small guard process (``_GUARD``):
:meth:`VLLMEngine.aclose` ends the group (SIGTERM, ``stop_grace`` seconds, then
SIGKILL), and should the worker child die outright the guard SIGKILLs the group
itself -- it notices by EOF on a pipe whose write end only the worker holds,
and by ``PR_SET_PDEATHSIG`` (which fires when the *thread* that started it ends:
call :meth:`start` from the child's event-loop thread). ``PR_SET_PDEATHSIG`` on
the API server alone is not enough: vLLM's engine-core and worker processes
outlive their killed API server.

``GET /health`` answering 200 is readiness (vLLM listens only once its engine
is up); ``context_length`` defaults to the served ``max_model_len`` of ``GET
/v1/models``. On CPU-only hosts useful ``extra_args`` are ``--dtype float32``
(the default there is bfloat16), ``--enforce-eager`` (torch.compile adds about
half a minute to the start on 2 cores) and ``--kv-cache-memory-bytes N`` (by
default the CPU backend reserves ``--gpu-memory-utilization`` of the NUMA
node's memory and refuses to start when other processes hold it).

Requests go to ``POST /v1/completions`` with the prompt as a list of token ids,
``stream: true`` and these vLLM extensions (checked against vLLM 0.32):

* ``return_token_ids: true`` -- each streamed choice carries ``token_ids``,
  the ids generated since the previous chunk (the first chunk also carries
  ``prompt_token_ids``);
* ``return_tokens_as_token_ids: true`` -- the tokens in ``logprobs``
  (``tokens`` and the keys of ``top_logprobs``) are spelled ``"token_id:123"``
  instead of text, so alternatives come back as ids;
* ``logprobs: N`` -- the sampled token's logprob (``token_logprobs``) and the
  ``N`` best alternatives (``top_logprobs``, the sampled token added when it is
  not among them);
* ``ignore_eos: true`` with ``stop_token_ids``: the engine stops only where the
  chat layer says (``GenParams.stop_ids``), like every poolgate engine;
* ``skip_special_tokens: false``.

The stop id that ends a sequence comes back in ``token_ids`` of the last chunk,
whose ``finish_reason`` is ``"stop"`` and ``stop_reason`` that id; it is the
last :class:`Step`. The engine's connection pool does not keep connections
alive (uvicorn drops idle ones after 5 s, which a reused connection would hit
as "Server disconnected"), and closing a :meth:`VLLMEngine.generate` iterator
closes its connection, on which vLLM aborts the request.

Logprobs are the model's raw distribution (log-softmax of the logits before
temperature, penalties, top-k/top-p): that is vLLM's ``--logprobs-mode
raw_logprobs``, which is its default; the command line sets it explicitly so a
changed default cannot silently change what ``Step.logprob`` means.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Mapping

from .engine import EngineError, GenParams, Step
from .engine_server import _ServerEngine

__all__ = ["VLLMEngine"]

class VLLMEngine(_ServerEngine):
    """A model served by a vLLM OpenAI-compatible server subprocess.

    ``python`` is the interpreter of the environment that has vLLM;
    ``extra_args`` go last on its command line (``--dtype float32``,
    ``--enforce-eager``...); ``env`` adds to its environment
    (``VLLM_HOST_IP=127.0.0.1`` is always set so its internal sockets stay on
    loopback)."""

    name = "vllm"
    _ready_path = "/health"
    _health_path = "/health"

    def __init__(self, model: str, *, served_model_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.served_model_name = served_model_name or model

    def command(self) -> list[str]:
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                "--served-model-name", self.served_model_name,
                "--max-num-seqs", str(self.capacity),
                "--logprobs-mode", "raw_logprobs"]
        if self._context_length is not None:
            argv += ["--max-model-len", str(self._context_length)]
        return argv + list(self.extra_args)

    env_defaults = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}

    def request_body(self, prompt_ids: list[int], params: GenParams) -> dict[str, Any]:
        """The ``/v1/completions`` body for one sequence."""
        body: dict[str, Any] = {
            "model": self.served_model_name,
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "stream": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "ignore_eos": True,
            "stop_token_ids": sorted(params.stop_ids),
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.logprobs or params.top_logprobs:
            # 0: the sampled token's logprob alone; N: and the N best alternatives
            body["logprobs"] = params.top_logprobs
            body["return_tokens_as_token_ids"] = True
        return body

    async def generate(self, prompt_ids: list[int], params: GenParams) -> AsyncIterator[Step]:
        self._check(prompt_ids, params)
        want_lp = params.logprobs or params.top_logprobs > 0
        sent = 0
        last: int | None = None
        body = self.request_body(prompt_ids, params)
        async with contextlib.aclosing(self._events("/v1/completions", body)) as events:
            async for chunk in events:
                for choice in chunk.get("choices") or ():
                    ids = choice.get("token_ids") or []
                    lps = choice.get("logprobs") or {}
                    tok_lps = lps.get("token_logprobs") or []
                    tops = lps.get("top_logprobs") or []
                    for i, tid in enumerate(ids):
                        lp = tok_lps[i] if want_lp and i < len(tok_lps) else None
                        top: tuple[tuple[int, float], ...] = ()
                        if params.top_logprobs and i < len(tops) and tops[i]:
                            top = _top_ids(tops[i], params.top_logprobs)
                        sent += 1
                        last = int(tid)
                        yield Step(last, float(lp) if lp is not None else None, top)
                        if sent >= params.max_tokens or last in params.stop_ids:
                            return
                    reason = choice.get("finish_reason")
                    if reason == "stop":
                        # a stop id ends the sequence as its last step; vLLM lists it in
                        # token_ids (stop_reason names it), but should a version leave
                        # it out, put it back
                        stop = choice.get("stop_reason")
                        if isinstance(stop, int) and stop in params.stop_ids and stop != last:
                            yield Step(stop)
                        return
                    if reason is not None:  # "length" (max_tokens or the context), "abort"...
                        if reason not in ("length",):
                            raise EngineError(f"vllm ended the sequence: {reason}", status=502)
                        return


def _top_ids(top: Mapping[str, float], n: int) -> tuple[tuple[int, float], ...]:
    """``{"token_id:123": -0.1, ...}`` as ``((123, -0.1), ...)``, best first, at most ``n``."""
    out = []
    for key, lp in top.items():
        tid = int(key.rsplit(":", 1)[1]) if key.startswith("token_id:") else int(key)
        out.append((tid, float(lp)))
    out.sort(key=lambda item: -item[1])
    return tuple(out[:n])

"""The SGLang engine: an SGLang server run as a subprocess of the worker child
(see :mod:`pool.local.vllm` for the supervision: loopback only, dies with the
child, its own process group), spoken to through SGLang's native API so token
ids and logprobs come back exactly.

``POST /generate`` (checked against the source of SGLang 0.5.23:
``GenerateReqInput``, ``SamplingParams``, ``http_server.py``,
``tokenizer_manager.py``) takes ``input_ids``, ``sampling_params``
(``max_new_tokens``, ``temperature``, ``top_p``, ``top_k`` -- ``-1`` for none
--, ``sampling_seed``, ``stop_token_ids``, ``ignore_eos``,
``skip_special_tokens``, ``no_stop_trim``), ``return_logprob``,
``top_logprobs_num``, ``logprob_start_len: -1`` (no prompt logprobs) and
``stream``. A stream is ``data: {json}`` events ending with ``data: [DONE]``;
each event has ``output_ids`` and ``meta_info`` with ``completion_tokens``,
``finish_reason`` (``null``, ``{"type": "stop", "matched": id}``,
``{"type": "length", ...}`` or ``{"type": "abort", "message": ...}``),
``output_token_logprobs`` (``[logprob, token_id, text|null]`` per token) and
``output_top_logprobs`` (a list of such triples per token).

Stops: SGLang's ``ignore_eos`` disables every token-based stop, its
``stop_token_ids`` too, and without it SGLang also stops at the model's EOS ids.
So ``ignore_eos`` is sent only when ``GenParams.stop_ids`` leaves out one of the
tokenizer's EOS ids (a client that asked to run past EOS); the engine then ends
the sequence at a stop id itself, closing the stream (SGLang aborts the
request). Should SGLang stop at an EOS id the tokenizer does not list, that
token is the last step all the same.

By default SGLang streams *cumulative* ``output_ids`` and logprob lists (all
tokens so far in every event: quadratic traffic); with
``--incremental-streaming-output`` it sends only the new ones. The engine starts
the server with that flag (``incremental=False`` leaves it out) and reads both
shapes: ``meta_info.completion_tokens`` counts all tokens so far, so a list that
long is cumulative and the tokens past those already emitted are new. SGLang
keeps the matched stop token in ``output_ids`` (``no_stop_trim`` only concerns
text); should it be missing, it is put back from ``finish_reason.matched``.

Readiness: ``GET /health`` answers 503 while the server is starting and 200
after its warm-up; then one ``GET /health_generate`` (a real one-token
generation) must answer 200 before :meth:`SGLangEngine.start` returns.
``context_length`` defaults to ``max_model_len`` of ``GET /v1/models``.

Logprobs: SGLang reports log-softmax *after temperature* unless the server runs
with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, which this engine sets so
``Step.logprob`` is the raw distribution as with every engine. ``sampling_seed``
only takes effect when the server runs with ``--enable-deterministic-inference``
(pass it in ``extra_args`` when seeded sampling must reproduce).

SGLang has no CPU build; the tests run this engine against
``tests/fakes/sglang_server.py`` through ``launcher``.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Sequence

from .engine import EngineError, GenParams, Step
from .engine_server import ServerStartError, _ServerEngine

__all__ = ["SGLangEngine"]


class SGLangEngine(_ServerEngine):
    """A model served by an SGLang server subprocess.

    ``launcher`` is what follows the interpreter on the command line (default
    ``-m sglang.launch_server``); ``python`` the interpreter of the environment
    that has SGLang; ``incremental`` adds ``--incremental-streaming-output``."""

    name = "sglang"
    _ready_path = "/health"
    _health_path = "/health"

    def __init__(self, model: str, *, launcher: Sequence[str] = ("-m", "sglang.launch_server"),
                 check_generate: bool = True, incremental: bool = True, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.launcher = tuple(launcher)
        self.incremental = incremental
        self.check_generate = check_generate

    def command(self) -> list[str]:
        argv = [self.python, *self.launcher, "--model-path", self.model,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--max-running-requests", str(self.capacity)]
        if self._context_length is not None:
            argv += ["--context-length", str(self._context_length)]
        if self.incremental:
            argv.append("--incremental-streaming-output")
        return argv + list(self.extra_args)

    # raw logprobs (before temperature), as every poolgate engine reports them; and
    # its own address as loopback (else SGLang probes the NICs or a remote host)
    env_defaults = {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1", "SGLANG_HOST_IP": "127.0.0.1"}

    async def _after_ready(self) -> None:
        # /health answers 200 once the server left its Starting state; one real
        # one-token generation (/health_generate) proves the scheduler works
        if self.check_generate:
            assert self._session is not None and self.server is not None
            try:
                async with self._session.get(self.base_url + "/health_generate") as resp:
                    ok = resp.status == 200
            except Exception as exc:  # noqa: BLE001 - any failure means not ready
                raise ServerStartError(f"sglang /health_generate failed: {exc}",
                                       self.server.log_tail()) from exc
            if not ok:
                raise ServerStartError(f"sglang /health_generate answered {resp.status}",
                                       self.server.log_tail())
        await super()._after_ready()

    def request_body(self, prompt_ids: list[int], params: GenParams) -> dict[str, Any]:
        """The ``/generate`` body for one sequence."""
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "stop_token_ids": sorted(params.stop_ids),
            # SGLang's ignore_eos turns off *every* token-based stop, stop_token_ids
            # included: set it only when the caller wants to run past an EOS, and
            # then generate() stops at the stop ids itself
            "ignore_eos": not self.tokenizer.eos_ids <= params.stop_ids,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        body: dict[str, Any] = {
            "input_ids": list(prompt_ids),
            "sampling_params": sampling,
            "stream": True,
        }
        if params.logprobs or params.top_logprobs:
            body["return_logprob"] = True
            body["logprob_start_len"] = -1
            body["top_logprobs_num"] = params.top_logprobs
        return body

    async def generate(self, prompt_ids: list[int], params: GenParams) -> AsyncIterator[Step]:
        self._check(prompt_ids, params)
        want_lp = params.logprobs or params.top_logprobs > 0
        sent = 0
        last: int | None = None
        body = self.request_body(prompt_ids, params)
        async with contextlib.aclosing(self._events("/generate", body)) as events:
            async for chunk in events:
                meta = chunk.get("meta_info") or {}
                out_ids = chunk.get("output_ids") or []
                total = int(meta.get("completion_tokens", sent + len(out_ids)))
                ids = _new(out_ids, total, sent)
                lps = _new(meta.get("output_token_logprobs") or [], total, sent) if want_lp else []
                tops = _new(meta.get("output_top_logprobs") or [], total, sent) if params.top_logprobs else []
                for i, tid in enumerate(ids):
                    lp = None
                    if i < len(lps) and lps[i] is not None and lps[i][0] is not None:
                        lp = float(lps[i][0])
                    top: tuple[tuple[int, float], ...] = ()
                    if i < len(tops) and tops[i]:
                        top = tuple((int(t[1]), float(t[0])) for t in tops[i][:params.top_logprobs])
                    sent += 1
                    last = int(tid)
                    yield Step(last, lp, top)
                    if sent >= params.max_tokens or last in params.stop_ids:
                        return  # with ignore_eos the server does not stop at stop ids
                finish = meta.get("finish_reason")
                if isinstance(finish, dict):
                    kind = finish.get("type")
                    if kind == "abort":
                        raise EngineError(f"sglang aborted the request: {finish.get('message')}",
                                          status=int(finish.get("status_code") or 503))
                    if kind == "stop":
                        # SGLang keeps the matched stop id in output_ids; should it not, put it back
                        matched = finish.get("matched")
                        if isinstance(matched, int) and matched in params.stop_ids and matched != last:
                            yield Step(matched)
                    return


def _new(items: list[Any], total: int, sent: int) -> list[Any]:
    """The entries of a streamed list not yet emitted: a cumulative list (as
    long as all tokens so far) from ``sent`` on, an incremental one whole."""
    return items[sent:] if len(items) == total else items

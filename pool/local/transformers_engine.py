"""The ``transformers`` engine: Hugging Face Transformers, the reference.

Any HF model folder or hub id. One scheduler thread owns the model and
advances every active sequence one token per round, round-robin, each with
its own KV cache: concurrent requests stream side by side (up to
``capacity``; more wait their turn in the queue), and a closed request leaves
the round at once. Logprobs come from the raw logits (``log_softmax`` before
temperature, top-k and top-p); sampling draws from a per-request
``torch.Generator`` so a ``seed`` reproduces the same tokens.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from .engine import EngineError, GenParams, Step
from .hf import HFTokenizer

__all__ = ["TransformersEngine"]

_END = object()
#: tokens a sequence may run ahead of its consumer; beyond that it sits out the
#: rounds (keeping its slot and cache) until the consumer catches up
AHEAD = 64


@dataclass(eq=False)
class _Seq:
    prompt: list[int]
    params: GenParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]
    generator: Any = None
    cache: Any = None
    last: int | None = None
    produced: int = 0
    consumed: int = 0  # steps its request took off the queue (on the loop's thread)
    stalled: bool = False  # sitting out: the consumer wakes the scheduler when it catches up
    cancelled: bool = False
    error: BaseException | None = field(default=None)


class TransformersEngine:
    name = "transformers"

    def __init__(self, model: str, *, context_length: int | None = None, capacity: int = 4,
                 threads: int | None = None, device: str = "cpu", dtype: str = "float32",
                 chat_template: str | None = None, engine_args: dict[str, Any] | None = None) -> None:
        self.model_path = model
        self._context = context_length
        self.capacity = max(1, capacity)
        self.threads = threads
        self.device = device
        self.dtype = dtype
        self._chat_template = chat_template
        self.engine_args = dict(engine_args or {})
        self.tokenizer: HFTokenizer = None  # type: ignore[assignment]  # set by start()
        self.context_length = context_length or 0
        self._model: Any = None
        self._torch: Any = None
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._active: list[_Seq] = []
        self._requests: set[_Seq] = set()  # every sequence whose request is open (loop thread)
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> int:
        """Sequences generating or waiting for a slot."""
        return len(self._active) + len(self._waiting)

    @property
    def buffered(self) -> int:
        """Tokens generated and not yet taken by their requests, over all sequences
        (each sequence at most ``AHEAD``: a slow reader pauses its own sequence)."""
        return sum(seq.produced - seq.consumed for seq in self._requests)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._thread = threading.Thread(target=self._run, name="poolgate-transformers", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if self.threads:
            torch.set_num_threads(self.threads)
        self._torch = torch
        self.tokenizer = HFTokenizer.from_pretrained(self.model_path, chat_template=self._chat_template)
        dtype = getattr(torch, self.dtype)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype, **self.engine_args)
        model.to(self.device)
        model.eval()
        self._model = model
        limit = getattr(model.config, "max_position_embeddings", None) or 2048
        self.context_length = min(self._context or limit, limit)
        self.tokenizer.vocab_size = min(self.tokenizer.vocab_size, model.config.vocab_size)

    async def healthy(self) -> bool:
        """The scheduler thread runs (a stall inside it shows as no progress)."""
        return self._thread is not None and self._thread.is_alive()

    async def aclose(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)

    # --- generation ----------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: GenParams) -> AsyncIterator[Step]:
        if self._model is None:
            raise EngineError("the model is not loaded", status=503)
        loop = asyncio.get_running_loop()
        seq = _Seq(list(prompt_ids), params, loop, asyncio.Queue())
        self._requests.add(seq)
        with self._wake:
            self._waiting.append(seq)
            self._wake.notify()
        try:
            while True:
                item = await seq.queue.get()
                if item is _END:
                    if seq.error is not None:
                        raise seq.error
                    return
                seq.consumed += 1
                if seq.stalled:
                    with self._wake:
                        seq.stalled = False
                        self._wake.notify()
                yield item
        finally:
            self._requests.discard(seq)
            with self._wake:
                seq.cancelled = True  # the scheduler drops it at its next round
                self._wake.notify()

    def _run(self) -> None:
        torch = self._torch
        with torch.inference_mode():
            while True:
                with self._wake:
                    while not self._stopping and not self._waiting and not self._active:
                        self._wake.wait()
                    if self._stopping:
                        for seq in [*self._active, *self._waiting]:
                            self._finish(seq, EngineError("the worker is stopping", status=503))
                        return
                    while self._waiting and len(self._active) < self.capacity:
                        self._active.append(self._waiting.popleft())
                    active = self._runnable()
                    if not active:  # every sequence is ahead of its reader: wait for one
                        self._wake.wait(1.0)
                        continue
                # one token for every active sequence, then one wake-up of the
                # event loop for the whole round (not one per token)
                out: list[tuple[_Seq, Any]] = []
                for seq in active:
                    done = True
                    if not seq.cancelled:
                        try:
                            step, done = self._advance(seq)
                            out.append((seq, step))
                        except Exception as exc:  # noqa: BLE001 - handed to the request
                            seq.error = EngineError(f"generation failed: {exc}", status=500)
                    if done:
                        if not seq.cancelled:
                            out.append((seq, _END))
                        with self._wake:
                            self._active.remove(seq)
                        seq.cache = None
                if out:
                    self._deliver(out)

    def _runnable(self) -> list[_Seq]:
        """The active sequences not too far ahead of their readers (under the lock)."""
        runnable = []
        for seq in self._active:
            if seq.cancelled or seq.produced - seq.consumed < AHEAD:
                runnable.append(seq)
            else:
                seq.stalled = True
        return runnable

    def _advance(self, seq: _Seq) -> tuple[Step, bool]:
        """One token for ``seq``, and whether it is finished."""
        torch = self._torch
        if seq.cache is None:
            inputs = torch.tensor([seq.prompt], device=self.device)
            if seq.params.seed is not None:
                seq.generator = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        else:
            inputs = torch.tensor([[seq.last]], device=self.device)
        out = self._model(input_ids=inputs, past_key_values=seq.cache, use_cache=True)
        seq.cache = out.past_key_values
        logits = out.logits[0, -1].float()
        token, logprob, top = self._pick(logits, seq)
        seq.last = token
        seq.produced += 1
        return Step(token, logprob, top), (token in seq.params.stop_ids
                                           or seq.produced >= seq.params.max_tokens)

    def _pick(self, logits: Any, seq: _Seq) -> tuple[int, float | None, tuple[tuple[int, float], ...]]:
        torch = self._torch
        p = seq.params
        if p.temperature <= 0:
            token = int(torch.argmax(logits))
        else:
            scores = logits / p.temperature
            if p.top_k and p.top_k < scores.shape[-1]:
                kth = torch.topk(scores, p.top_k).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if p.top_p < 1.0:
                ordered, order = torch.sort(scores, descending=True)
                cumulative = torch.softmax(ordered, -1).cumsum(-1)
                drop = cumulative - torch.softmax(ordered, -1) >= p.top_p  # keep the first over top_p
                scores = scores.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
            probs = torch.softmax(scores, -1)
            token = int(torch.multinomial(probs, 1, generator=seq.generator))
        if not p.logprobs:
            return token, None, ()
        logprobs = torch.log_softmax(logits, -1)
        top: tuple[tuple[int, float], ...] = ()
        if p.top_logprobs:
            values, ids = torch.topk(logprobs, p.top_logprobs)
            top = tuple(zip(ids.tolist(), values.tolist()))
        return token, float(logprobs[token]), top

    def _finish(self, seq: _Seq, error: BaseException | None = None) -> None:
        seq.error = error
        self._deliver([(seq, _END)])

    @staticmethod
    def _deliver(items: list[tuple[_Seq, Any]]) -> None:
        """Hand steps (or ``_END``) to their requests' queues, on their loop."""
        def put() -> None:
            for seq, item in items:
                seq.queue.put_nowait(item)

        try:
            items[0][0].loop.call_soon_threadsafe(put)  # every request runs on the child's one loop
        except RuntimeError:  # that loop is gone
            pass

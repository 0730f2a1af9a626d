"""The pool: which workers serve which models, and which one takes a request.

This is the minimal pool of the gateway core: model and alias resolution,
capability checks, least-in-flight choice among ready workers, and in-flight
accounting released on every path. Supervision, admission limits and affinity
routing build on it.
"""

from __future__ import annotations

import asyncio
import time
from fnmatch import fnmatchcase
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import structlog

from .errors import BadRequest, NoUsableWorker, NotFound, Overloaded
from .model import ChatRequest, ImagePart, ToolResultPart
from .worker import Capabilities, Worker, WorkerState

__all__ = ["Pool", "ModelEntry", "check_capabilities"]

log = structlog.get_logger("pool")


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: str
    owned_by: str
    alias_of: str | None = None


def is_pattern(alias: str) -> bool:
    """A glob alias (``claude-*``) rather than one name."""
    return any(c in alias for c in "*?[")


class Pool:
    def __init__(self, workers: Sequence[Worker], *, default_model: str | None = None) -> None:
        self.workers: tuple[Worker, ...] = tuple(workers)
        self._serving: dict[str, list[Worker]] = {}
        self._aliases: dict[str, str] = {}
        self._patterns: list[tuple[str, str]] = []  # (glob, model) in configuration order
        for worker in self.workers:
            for model in worker.models:
                self._serving.setdefault(model, []).append(worker)
            for alias, model in worker.aliases.items():
                if is_pattern(alias):
                    self._patterns.append((alias, model))
                else:
                    self._aliases.setdefault(alias, model)
        self._matched: dict[str, str | None] = {}  # names already looked up among the globs
        if default_model is not None and self._named(default_model) is None:
            raise ValueError(f"default_model {default_model!r} is not served by any worker")
        self.default_model = default_model
        self.in_flight: dict[str, int] = {w.name: 0 for w in self.workers}
        self.probe_seconds: dict[str, float] = {}
        self._cooling_until: dict[str, tuple[float, int]] = {}

    # --- models -------------------------------------------------------------

    def models(self) -> list[ModelEntry]:
        """Every model and alias, in configuration order, each once."""
        entries: dict[str, ModelEntry] = {}
        for worker in self.workers:
            for model in worker.models:
                entries.setdefault(model, ModelEntry(model, worker.name))
            for alias, model in worker.aliases.items():
                if not is_pattern(alias):  # a glob is no model id to list
                    entries.setdefault(alias, ModelEntry(alias, worker.name, alias_of=model))
        return list(entries.values())

    def resolve(self, name: str) -> str:
        """The served model id for a client-facing name: a model, an alias, the
        first glob alias it matches (``claude-*``), else the ``default_model``."""
        if name in self._serving:
            return name
        target = self._named(name)
        if target is None and self.default_model is not None:
            target = self._named(self.default_model)
        if target is not None:
            return target
        raise NotFound(f"The model '{name}' does not exist or is not served here.",
                       param="model", code="model_not_found")

    def _named(self, name: str) -> str | None:
        if name in self._serving:
            return name
        target = self._aliases.get(name)
        if target is not None and target in self._serving:
            return target
        if not self._patterns:
            return None
        if name in self._matched:
            return self._matched[name]
        target = next((m for glob, m in self._patterns
                       if fnmatchcase(name, glob) and m in self._serving), None)
        if len(self._matched) >= 4096:  # client-chosen names: keep the memo bounded
            self._matched.clear()
        self._matched[name] = target
        return target

    def model_label(self, name: str | None) -> str:
        """A bounded metrics label for a client's model name: the served model it
        resolves to, else ``unknown`` (clients choose names; labels must not grow)."""
        if not name:
            return "unknown"
        try:
            return self.resolve(name)
        except NotFound:
            return "unknown"

    def knows(self, name: str) -> bool:
        return self._named(name) is not None or (
            self.default_model is not None and self._named(self.default_model) is not None)

    # --- choosing a worker --------------------------------------------------------

    def pick(self, request: ChatRequest, prefer: str | None = None,
             exclude: Sequence[str] = ()) -> tuple[Worker, ChatRequest]:
        """Choose a ready worker for ``request`` — ``prefer`` (a worker name,
        e.g. the one that served the previous turn) when it is eligible, else
        the least busy — and return the request as that worker must see it
        (alias resolved to the served model id)."""
        model = self.resolve(request.model)
        ready = [w for w in self._serving[model]
                 if w.state is WorkerState.READY and w.name not in exclude]
        if not ready:
            raise Overloaded(f"No worker serving '{request.model}' is ready; try again shortly.",
                             retry_after=1)
        worker = None
        if prefer is not None:
            worker = next((w for w in ready if w.name == prefer), None)
        if worker is None:
            worker = (min(ready, key=lambda w: self.in_flight[w.name]) if len(ready) > 1
                      else ready[0])
        check_capabilities(request, worker.capabilities)
        if model != request.model:
            request = replace(request, model=model)
        return worker, request

    def eligible(self, request: ChatRequest,
                 exclude: Sequence[str] = ()) -> tuple[list[Worker], ChatRequest]:
        """The workers that may take ``request`` — ready (not draining, not
        unhealthy), serving its model, not excluded, able to honour it, and not
        cooling down after an error unless all are — and the request as they
        must see it (alias resolved)."""
        model = self.resolve(request.model)
        ready = [w for w in self._serving[model]
                 if w.state is WorkerState.READY and w.name not in exclude]
        if not ready:
            candidates = [w for w in self._serving[model] if w.name not in exclude]
            reasons = [r for w in candidates if (r := getattr(w, "unavailable_reason", None))]
            if candidates and len(reasons) == len(candidates):
                raise NoUsableWorker(f"No worker can serve '{request.model}': "
                                     f"{'; '.join(reasons)}.")
            why = f" ({'; '.join(reasons)})" if reasons else ""
            raise Overloaded(f"No worker serving '{request.model}' is ready{why}; try again "
                             "shortly.", retry_after=1)
        now = time.monotonic()
        warm = [w for w in ready if not self._cooling(w, now)]
        workers = warm or ready
        capable = []
        refusal: BadRequest | None = None
        for worker in workers:
            try:
                check_capabilities(request, worker.capabilities)
            except BadRequest as exc:
                refusal = refusal or exc
            else:
                capable.append(worker)
        if not capable:
            assert refusal is not None
            raise refusal
        workers = capable
        if model != request.model:
            request = replace(request, model=model)
        return workers, request

    def cool_down(self, name: str, seconds: float) -> None:
        """After an error, send ``name`` nothing new for ``seconds`` while others
        can serve — or until it is restarted (a new process owes nothing to the old)."""
        restarts = getattr(self.worker(name), "restarts", 0)
        self._cooling_until[name] = (time.monotonic() + seconds, restarts)

    def _cooling(self, worker: Worker, now: float) -> bool:
        reset = getattr(worker, "cooldown_until", None)  # a cli account's rate limit (Unix time)
        if reset is not None and reset > time.time():
            return True
        until = self._cooling_until.get(worker.name)
        if until is None:
            return False
        deadline, restarts = until
        return now < deadline and getattr(worker, "restarts", 0) == restarts

    def acquire(self, worker: Worker) -> None:
        self.in_flight[worker.name] += 1

    def release(self, worker: Worker) -> None:
        self.in_flight[worker.name] -= 1

    def ready_models(self) -> dict[str, bool]:
        return {m: any(w.state is WorkerState.READY for w in ws) for m, ws in self._serving.items()}

    def worker(self, name: str) -> Worker:
        for w in self.workers:
            if w.name == name:
                return w
        raise NotFound(f"No worker named '{name}'.", param="name")

    async def probe(self) -> None:
        """One round of health probes for the workers the pool itself watches
        (remote ones; process workers are probed by their supervisor)."""
        async def one(worker: Worker) -> None:
            started = time.perf_counter()
            try:
                await worker.health()
            except Exception:  # noqa: BLE001 - a probe that breaks is a failed probe
                log.warning("pool.probe_failed", worker=worker.name, exc_info=True)
            self.probe_seconds[worker.name] = time.perf_counter() - started

        await asyncio.gather(*(one(w) for w in self.workers if w.kind == "remote"))

    async def probe_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.probe()

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.gather(*(w.start() for w in self.workers))

    async def aclose(self) -> None:
        await asyncio.gather(*(w.aclose() for w in self.workers), return_exceptions=True)


def check_capabilities(request: ChatRequest, caps: Capabilities) -> None:
    """Refuse, naming the parameter, what the worker cannot honour."""
    if request.sampling.n > caps.max_n:
        raise BadRequest(f"n={request.sampling.n} is not supported by this model's worker "
                         f"(at most {caps.max_n}).", param="n")
    if (request.prompt_ids is not None or request.dialect == "native") and not caps.token_ids:
        param = "model" if request.dialect == "native" else "prompt"
        raise BadRequest("This model's worker does not take token ids (/generate and token-id "
                         "prompts need a local worker).", param=param)
    if request.logprobs and not caps.logprobs:
        raise BadRequest("logprobs are not available from this model's worker.", param="logprobs")
    if request.tools and not caps.tools:
        raise BadRequest("This model's worker does not support tools.", param="tools")
    if not caps.images and _has_images(request):
        raise BadRequest("This model's worker does not accept images.", param="messages")


def _has_images(request: ChatRequest) -> bool:
    return any(isinstance(p, ImagePart) or (isinstance(p, ToolResultPart) and _any_image(p.content))
               for m in request.messages for p in m.parts)


def _any_image(parts: Iterable[object]) -> bool:
    return any(isinstance(p, ImagePart) for p in parts)

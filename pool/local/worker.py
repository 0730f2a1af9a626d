"""The gateway's side of a local worker: a supervised ``python -m pool.local``
child holding one engine (see :mod:`pool.local`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from ..errors import UpstreamUnavailable
from ..model import ChatRequest
from ..process import ProcessSpec, ProcessWorker
from ..wire import request_to_dict
from ..worker import Capabilities, WorkerState

__all__ = ["LocalSpec", "LocalWorker", "ENGINES"]

ENGINES = ("llamacpp", "transformers", "vllm", "sglang")


@dataclass(frozen=True, slots=True)
class LocalSpec:
    """One local model worker. ``capacity`` is the engine's parallel sequences;
    ``max_in_flight`` how many requests the gateway lets the worker hold
    (those beyond ``capacity`` queue inside the engine)."""

    name: str
    engine: str
    model: str
    models: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)
    context_length: int | None = None
    capacity: int = 4
    max_in_flight: int = 64
    threads: int | None = None
    gpu_ids: tuple[int, ...] | None = None
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    # what a request gets for sampling it leaves out, over the model's own recommendation
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    python: str | None = None  # the interpreter whose environment has the engine
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    env_passthrough: tuple[str, ...] = ()  # names of the gateway's variables the child also gets
    ready_timeout: float = 120.0
    health_interval: float = 5.0
    health_timeout: float = 5.0
    stop_timeout: float = 10.0
    call_timeout: float = 30.0   # count_tokens, engine stats: then a 504
    read_timeout: float = 120.0  # the engine producing no token while asked: wedged

    def child_config(self) -> dict[str, Any]:
        """What the child needs to load its engine (``--config``)."""
        return {"engine": self.engine, "model": self.model, "served_name": self.models[0],
                "context_length": self.context_length, "capacity": self.capacity,
                "threads": self.threads, "gpu_ids": list(self.gpu_ids) if self.gpu_ids else None,
                "engine_args": dict(self.engine_args), "chat_template": self.chat_template,
                "sampling_defaults": dict(self.sampling_defaults),
                "read_timeout": self.read_timeout,
                # the engine's health check must fit in the gateway's ping deadline
                "check_timeout": self.health_timeout / 2}

    def process_spec(self) -> ProcessSpec:
        command = (self.python or sys.executable, "-m", "pool.local", "--config",
                   orjson.dumps(self.child_config()).decode())
        env = dict(self.env)
        if self.gpu_ids is not None and self.engine in ("transformers", "llamacpp"):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpu_ids))
        return ProcessSpec(name=self.name, command=command, models=self.models,
                           aliases=dict(self.aliases), capacity=self.max_in_flight, env=env,
                           env_passthrough=tuple(self.env_passthrough),
                           ready_timeout=self.ready_timeout, health_interval=self.health_interval,
                           health_timeout=self.health_timeout, stop_timeout=self.stop_timeout)


class LocalWorker(ProcessWorker):
    """A :class:`~pool.process.ProcessWorker` running a model engine; it also
    counts tokens exactly (the model's tokenizer and chat template) and takes
    token-id prompts."""

    kind = "local"

    def __init__(self, spec: LocalSpec, *, base_env: Mapping[str, str] = {}) -> None:
        super().__init__(spec.process_spec(), base_env=base_env,
                         capabilities=Capabilities(images=False, logprobs=True, max_n=1, tools=True,
                                                   token_ids=True))
        self.local = spec

    async def count_tokens(self, request: ChatRequest) -> int:
        value = await self._call("count_tokens", request_to_dict(request))
        return int(value)  # type: ignore[arg-type]

    async def engine_stats(self) -> dict[str, Any]:
        """The engine's own view: its name, sequences generating now, context length."""
        return dict(await self._call("stats", None))  # type: ignore[call-overload]

    async def _call(self, method: str, params: Any) -> Any:
        child = self._child()
        if self.state not in (WorkerState.READY, WorkerState.DRAINING) or child is None:
            raise UpstreamUnavailable(f"worker {self.name} is {self.state.value}")
        return await child.call(method, params, timeout=self.local.call_timeout)

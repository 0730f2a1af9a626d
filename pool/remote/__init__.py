"""``remote`` workers: an OpenAI- or Anthropic-compatible HTTP upstream."""

from __future__ import annotations

from pool.worker import Worker

from .base import RemoteSpec, RemoteWorker
from .workers import AnthropicMessagesWorker, OpenAIChatWorker

__all__ = ["RemoteSpec", "RemoteWorker", "OpenAIChatWorker", "AnthropicMessagesWorker",
           "make_remote_worker"]


def make_remote_worker(spec: RemoteSpec) -> Worker:
    """The worker for ``spec.dialect``; call ``await worker.start()`` before use."""
    if spec.dialect == "openai":
        return OpenAIChatWorker(spec)
    if spec.dialect == "anthropic":
        return AnthropicMessagesWorker(spec)
    raise ValueError(f"unknown remote dialect {spec.dialect!r}")

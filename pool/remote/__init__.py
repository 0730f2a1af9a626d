"""``remote`` workers: an OpenAI-, Anthropic- or Gemini-compatible HTTP upstream."""

from __future__ import annotations

from pool.worker import Worker

from .base import RemoteSpec, RemoteWorker
from .workers import AnthropicMessagesWorker, GeminiWorker, OpenAIChatWorker

__all__ = ["RemoteSpec", "RemoteWorker", "OpenAIChatWorker", "AnthropicMessagesWorker",
           "GeminiWorker", "make_remote_worker"]


def make_remote_worker(spec: RemoteSpec) -> Worker:
    """The worker for ``spec.dialect``; call ``await worker.start()`` before use."""
    if spec.dialect == "openai":
        return OpenAIChatWorker(spec)
    if spec.dialect == "anthropic":
        return AnthropicMessagesWorker(spec)
    if spec.dialect == "gemini":
        return GeminiWorker(spec)
    raise ValueError(f"unknown remote dialect {spec.dialect!r}")

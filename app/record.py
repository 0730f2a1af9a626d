"""The per-request record the middleware logs and counts once a response ends."""

from __future__ import annotations

__all__ = ["RequestRecord"]


class RequestRecord:
    """Filled in as a request goes: the middleware sets the envelope, the route
    the dialect, model and worker, the stream its tokens and outcome."""

    __slots__ = ("request_id", "method", "path", "status", "key", "key_id", "dialect", "model", "worker",
                 "tokens_in", "tokens_out", "tokens_cached", "ttft", "error", "disconnected", "duration",
                 "anthropic_version", "stream", "started")

    def __init__(self, request_id: str, method: str, path: str, started: float = 0.0) -> None:
        self.started = started  # time.perf_counter() at arrival
        self.request_id = request_id
        self.method = method
        self.path = path
        self.status = 0
        self.key = "anonymous"
        self.key_id = "anonymous"  # the key's id when it was authenticated (its name may be reused)
        self.dialect: str | None = None
        self.model: str | None = None
        self.worker: str | None = None
        self.tokens_in: int | None = None
        self.tokens_out: int | None = None
        self.tokens_cached: int | None = None
        self.ttft: float | None = None
        self.error: str | None = None
        self.disconnected = False
        self.duration = 0.0
        self.anthropic_version = False
        self.stream = False

    def error_dialect(self) -> str:
        if self.dialect == "gemini":
            return "gemini"
        if self.path.startswith("/v1/messages"):
            return "anthropic"
        if self.anthropic_version and self.path.startswith("/v1/models"):
            return "anthropic"
        return "openai"

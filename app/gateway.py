"""The running gateway: what the routes need, built once from Settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from auth.keys import TokenGate
from pool.pool import Pool
from sessions.responses import MemoryResponseStore, ResponseStore

from .record import RequestRecord

__all__ = ["Gateway"]

access_log = structlog.get_logger("poolgate.access")


@dataclass(slots=True, eq=False)
class Gateway:
    settings: Any
    metrics: Any
    admin: TokenGate
    metrics_gate: TokenGate
    metrics_public: bool
    max_body_bytes: int
    ping_interval: float = 10.0
    pool: Pool = field(default_factory=lambda: Pool(()))
    configured_models: tuple[str, ...] = ()
    responses: ResponseStore = field(default_factory=MemoryResponseStore)

    def acquire(self, worker: Any) -> None:
        self.pool.acquire(worker)
        self.metrics.in_flight_started(worker.name)

    def release(self, worker: Any) -> None:
        self.pool.release(worker)
        self.metrics.in_flight_finished(worker.name)

    def in_flight(self, worker: str) -> int:
        return self.pool.in_flight.get(worker, 0)

    def stats(self) -> dict[str, Any]:
        """What ``/internal/stats`` shows: the pool and the stores."""
        return {"in_flight": dict(self.pool.in_flight),
                "responses": self.responses.stats()}

    def metrics_upstream_error(self, worker: str, kind: str) -> None:
        self.metrics.observe_upstream_error(worker=worker, kind=kind)

    def finish(self, record: RequestRecord) -> None:
        """The end of every HTTP request: one access log line, the metrics."""
        if record.dialect is not None:
            self.metrics.observe_request(
                dialect=record.dialect,
                model=record.model if record.model and self.pool.knows(record.model) else "unknown",
                worker=record.worker or "none", key=record.key, status=record.status,
                duration=record.duration, ttft=record.ttft,
                tokens_in=record.tokens_in, tokens_out=record.tokens_out)
        fields: dict[str, Any] = {
            "method": record.method, "path": record.path, "status": record.status,
            "latency_ms": round(record.duration * 1000, 2), "key": record.key,
        }
        if record.dialect is not None:
            fields.update(dialect=record.dialect, model=record.model, worker=record.worker,
                          stream=record.stream, tokens_in=record.tokens_in,
                          tokens_out=record.tokens_out)
            if record.ttft is not None:
                fields["ttft_ms"] = round(record.ttft * 1000, 2)
        if record.error is not None:
            fields["error"] = record.error
        if record.status >= 500:
            access_log.warning("http.request", **fields)
        else:
            access_log.info("http.request", **fields)

"""Structured logging and Prometheus metrics.

``configure_logging`` sets up one pipeline for structlog and for stdlib logging
(uvicorn's loggers included): context variables bound per request, ISO UTC
timestamps, secret redaction, then JSON lines (orjson) or console text on one
stream. ``Metrics`` owns its own registry, so several apps can share a process.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TextIO

import orjson
import prometheus_client
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["REDACTED", "redact_secrets", "configure_logging", "Metrics", "LATENCY_BUCKETS", "UNKNOWN"]

REDACTED = "***"
UNKNOWN = "unknown"

_SENSITIVE_NAMES = frozenset({
    "authorization", "proxy_authorization", "api_key", "apikey", "x_api_key", "token", "secret",
    "password", "passwd", "cookie", "set_cookie",
})
# Suffixes, not substrings: "max_tokens" and "input_tokens" are counts, not secrets.
_SENSITIVE_SUFFIXES = ("_token", "_secret", "_password", "_api_key", "_apikey")
_MAX_DEPTH = 8


@functools.lru_cache(maxsize=4096)
def _sensitive_name(key: str) -> bool:
    k = key.lower().replace("-", "_")
    return k in _SENSITIVE_NAMES or k.endswith(_SENSITIVE_SUFFIXES)


def _is_sensitive(key: Any) -> bool:
    if isinstance(key, bytes):
        key = key.decode("latin-1")
    return isinstance(key, str) and _sensitive_name(key)


def _scrub(value: Any, depth: int) -> Any:
    """A copy of ``value`` with sensitive entries replaced; the caller's objects are left alone."""
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: REDACTED if _is_sensitive(k) else _scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        out = []
        for item in value:
            # Header lists: [(name, value), ...]
            if isinstance(item, list | tuple) and len(item) == 2 and _is_sensitive(item[0]):
                out.append([item[0], REDACTED] if isinstance(item, list) else (item[0], REDACTED))
            else:
                out.append(_scrub(item, depth + 1))
        return out if isinstance(value, list) else tuple(out)
    return value


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def redact_secrets(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: values under secret-looking keys (at any depth) become ``***``."""
    # On every log line: keys are str (keyword arguments), most values are scalars.
    for key, value in event_dict.items():
        if _sensitive_name(key):
            event_dict[key] = REDACTED
        elif value.__class__ not in _SCALARS and isinstance(value, Mapping | list | tuple):
            event_dict[key] = _scrub(value, 1)
    return event_dict


def _dumps(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=repr, option=orjson.OPT_NON_STR_KEYS).decode()


_HANDLER_MARK = "_poolgate_handler"


def configure_logging(
    level: str = "info", fmt: Literal["json", "console"] = "json", *,
    stream: TextIO | None = None, cache_loggers: bool = False,
) -> None:
    """Route structlog and stdlib logging through one renderer writing lines to ``stream`` (stdout).

    ``cache_loggers`` freezes loggers on first use (faster; the server turns it
    on, tests leave it off so ``structlog.testing.capture_logs`` keeps working).
    """
    stream = stream if stream is not None else sys.stdout
    level_no = logging.getLevelNamesMapping()[level.upper()]
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    if fmt == "json":
        shared.append(structlog.processors.format_exc_info)
        renderer: Any = structlog.processors.JSONRenderer(serializer=_dumps)
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(stream))
    else:
        raise ValueError(f"log format must be 'json' or 'console', not {fmt!r}")

    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=cache_loggers,
    )

    handler = logging.StreamHandler(stream)
    handler.setLevel(level_no)  # also for loggers with a level of their own (uvicorn sets some)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_no)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# 1 ms .. 120 s, roughly 2.5x apart.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    """Gateway metrics on a private registry.

    Labels must come from configuration, never from raw client input: pass
    ``models`` (the configured names) and any other model becomes ``unknown``;
    ``key`` is a key *name* from the key ring; ``worker`` is a configured worker
    name (or ``none`` when no worker was picked). Label children are cached, so
    an observation is a couple of dict lookups.
    """

    def __init__(self, models: Iterable[str] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._models = frozenset(models) if models is not None else None
        r = self.registry
        self._requests = Counter(
            "poolgate_requests", "Requests answered.", ("dialect", "model", "worker", "key", "status"), registry=r)
        self._duration = Histogram(
            "poolgate_request_duration_seconds", "Time from request to the last byte of the answer.",
            ("dialect", "model"), buckets=LATENCY_BUCKETS, registry=r)
        self._ttft = Histogram(
            "poolgate_time_to_first_token_seconds", "Time from request to the first generated token.",
            ("dialect", "model"), buckets=LATENCY_BUCKETS, registry=r)
        self._tokens = Counter(
            "poolgate_tokens", "Tokens processed.", ("model", "key", "direction"), registry=r)
        self._in_flight = Gauge(
            "poolgate_in_flight", "Requests being served, per worker.", ("worker",), registry=r)
        self._upstream_errors = Counter(
            "poolgate_upstream_errors", "Failures talking to a worker.", ("worker", "kind"), registry=r)
        self._children: dict[tuple, Any] = {}
        self._request_groups: dict[tuple, tuple] = {}  # observe_request's label set -> its five children

    def _child(self, metric: Any, labels: tuple) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*(str(v) for v in labels))
        return child

    def _model(self, model: str) -> str:
        if self._models is not None and model not in self._models:
            return UNKNOWN
        return model

    def observe_request(
        self, *, dialect: str, model: str, worker: str, key: str, status: int, duration: float,
        ttft: float | None = None, tokens_in: int | None = None, tokens_out: int | None = None,
    ) -> None:
        """One finished request: status, duration, time to first token and tokens, when known."""
        group = (dialect, model, worker, key, status)
        children = self._request_groups.get(group)
        if children is None:
            children = self._request_groups[group] = self._request_children(group)
        requests, duration_hist, ttft_hist, tokens_in_counter, tokens_out_counter = children
        requests.inc()
        duration_hist.observe(duration)
        if ttft is not None:
            ttft_hist.observe(ttft)
        if tokens_in:
            tokens_in_counter.inc(tokens_in)
        if tokens_out:
            tokens_out_counter.inc(tokens_out)

    def _request_children(self, group: tuple) -> tuple:
        dialect, model, worker, key, status = group
        model = self._model(model)
        return (
            self._child(self._requests, (dialect, model, worker, key, status)),
            self._child(self._duration, (dialect, model)),
            self._child(self._ttft, (dialect, model)),
            self._child(self._tokens, (model, key, "input")),
            self._child(self._tokens, (model, key, "output")),
        )

    def observe_first_token(self, *, dialect: str, model: str, seconds: float) -> None:
        self._child(self._ttft, (dialect, self._model(model))).observe(seconds)

    def add_tokens(self, *, model: str, key: str, tokens_in: int | None = 0, tokens_out: int | None = 0) -> None:
        model = self._model(model)
        if tokens_in:
            self._child(self._tokens, (model, key, "input")).inc(tokens_in)
        if tokens_out:
            self._child(self._tokens, (model, key, "output")).inc(tokens_out)

    def in_flight_started(self, worker: str) -> None:
        self._child(self._in_flight, (worker,)).inc()

    def in_flight_finished(self, worker: str) -> None:
        self._child(self._in_flight, (worker,)).dec()

    def observe_upstream_error(self, *, worker: str, kind: str) -> None:
        self._child(self._upstream_errors, (worker, kind)).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for ``GET /metrics``."""
        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST

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
from bisect import bisect_left
from contextvars import ContextVar
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, TextIO

import orjson
import prometheus_client
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from auth.keys import ANONYMOUS

from . import access_log

__all__ = ["REDACTED", "redact_secrets", "current_request", "add_request", "configure_logging",
           "Metrics", "LATENCY_BUCKETS", "UNKNOWN"]

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


# The request being served (the middleware's RequestRecord): its id, and its key once
# authenticated, go into every line logged while it is served (also by tasks it
# starts). One ContextVar.set per request, where structlog's clear + bind would
# copy the whole context twice.
current_request: ContextVar[Any] = ContextVar("poolgate_request", default=None)


def add_request(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """``request_id`` and ``key`` of the request being served (fields the event sets win)."""
    record = current_request.get()
    if record is not None:
        event_dict.setdefault("request_id", record.request_id)
        if record.key != ANONYMOUS:  # no key identified (auth is off)
            event_dict.setdefault("key", record.key)
    return event_dict


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
    stream: TextIO | None = None, cache_loggers: bool = False, batch_access: bool = False,
) -> None:
    """Route structlog and stdlib logging through one renderer writing lines to ``stream`` (stdout).

    ``cache_loggers`` freezes loggers on first use (faster; the server turns it
    on, tests leave it off so ``structlog.testing.capture_logs`` keeps working).
    ``batch_access`` (the server; JSON only) writes the access lines from a
    bounded buffer in batches (:mod:`app.access_log`) instead of through structlog.
    """
    stream = stream if stream is not None else sys.stdout
    level_no = logging.getLevelNamesMapping()[level.upper()]
    shared: list[Any] = [
        add_request,
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
    access_log.install(access_log.AccessLines(stream, level_no)
                       if batch_access and fmt == "json" else None)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# 1 ms .. 120 s, roughly 2.5x apart.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _Histogram:
    """One histogram series: per-bucket counts (made cumulative at scrape time) and a sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, value)] += 1  # first bound >= value: Prometheus' "le"
        self.total += value


class _Collector:
    """Plain dicts turned into Prometheus families at scrape time.

    prometheus_client's own metric types take a lock per update (~1-3 us each);
    updates here are one dict operation. Not thread-safe by design: the
    gateway updates and renders its metrics on the event loop thread.
    """

    def __init__(self) -> None:
        self.requests: dict[tuple, float] = {}
        self.duration: dict[tuple, _Histogram] = {}
        self.ttft: dict[tuple, _Histogram] = {}
        self.tokens: dict[tuple, float] = {}
        self.in_flight: dict[tuple, float] = {}
        self.upstream_errors: dict[tuple, float] = {}

    def collect(self) -> Iterator[Any]:
        yield _counter("poolgate_requests", "Requests answered.",
                       ("dialect", "model", "worker", "key", "status"), self.requests)
        yield _histogram("poolgate_request_duration_seconds", "Time from request to the last byte of the answer.",
                         ("dialect", "model"), self.duration)
        yield _histogram("poolgate_time_to_first_token_seconds", "Time from request to the first generated token.",
                         ("dialect", "model"), self.ttft)
        yield _counter("poolgate_tokens", "Tokens processed.", ("model", "key", "direction"), self.tokens)
        gauge = GaugeMetricFamily("poolgate_in_flight", "Requests being served, per worker.", labels=("worker",))
        for labels, value in list(self.in_flight.items()):
            gauge.add_metric(labels, value)
        yield gauge
        yield _counter("poolgate_upstream_errors", "Failures talking to a worker.", ("worker", "kind"),
                       self.upstream_errors)
        yield _counter("poolgate_access_log_dropped",
                       "Access log lines dropped: the log stream could not keep up (or failed).",
                       (), {(): access_log.dropped_total()})


def _counter(name: str, doc: str, labels: tuple[str, ...], series: dict[tuple, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, count in list(series.items()):
        family.add_metric([str(v) for v in values], count)
    return family


_LE = [*(str(b) for b in LATENCY_BUCKETS), "+Inf"]


def _histogram(name: str, doc: str, labels: tuple[str, ...], series: dict[tuple, _Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, hist in list(series.items()):
        buckets, running = [], 0
        for le, count in zip(_LE, hist.counts):
            running += count
            buckets.append((le, running))
        family.add_metric([str(v) for v in values], buckets, hist.total)
    return family


class Metrics:
    """Gateway metrics on a private registry (several apps can share a process).

    Labels must come from configuration, never from raw client input: pass
    ``models`` (the configured names) and any other model becomes ``unknown``;
    ``key`` is a key *name* from the key ring; ``worker`` is a configured worker
    name (or ``none`` when no worker was picked). Call from the event loop thread.
    """

    def __init__(self, models: Iterable[str] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._models = frozenset(models) if models is not None else None
        self._data = _Collector()
        self.registry.register(self._data)

    def _model(self, model: str) -> str:
        if self._models is not None and model not in self._models:
            return UNKNOWN
        return model

    def observe_request(
        self, *, dialect: str, model: str, worker: str, key: str, status: int, duration: float,
        ttft: float | None = None, tokens_in: int | None = None, tokens_out: int | None = None,
        tokens_cached: int | None = None,
    ) -> None:
        """One finished request: status, duration, time to first token and tokens, when known."""
        data = self._data
        model = self._model(model)
        labels = (dialect, model, worker, key, status)
        data.requests[labels] = data.requests.get(labels, 0) + 1
        pair = (dialect, model)
        hist = data.duration.get(pair)
        if hist is None:
            hist = data.duration[pair] = _Histogram()
        hist.observe(duration)
        if ttft is not None:
            self._observe_ttft(pair, ttft)
        if tokens_in or tokens_out:
            self._add_tokens(model, key, tokens_in, tokens_out, tokens_cached)

    def observe_first_token(self, *, dialect: str, model: str, seconds: float) -> None:
        self._observe_ttft((dialect, self._model(model)), seconds)

    def add_tokens(self, *, model: str, key: str, tokens_in: int | None = 0, tokens_out: int | None = 0) -> None:
        self._add_tokens(self._model(model), key, tokens_in, tokens_out)

    def in_flight_started(self, worker: str) -> None:
        gauge = self._data.in_flight
        gauge[(worker,)] = gauge.get((worker,), 0) + 1

    def in_flight_finished(self, worker: str) -> None:
        gauge = self._data.in_flight
        gauge[(worker,)] = gauge.get((worker,), 0) - 1

    def observe_upstream_error(self, *, worker: str, kind: str) -> None:
        errors = self._data.upstream_errors
        errors[(worker, kind)] = errors.get((worker, kind), 0) + 1

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for ``GET /metrics``."""
        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST

    def _observe_ttft(self, pair: tuple[str, str], seconds: float) -> None:
        hist = self._data.ttft.get(pair)
        if hist is None:
            hist = self._data.ttft[pair] = _Histogram()
        hist.observe(seconds)

    def _add_tokens(self, model: str, key: str, tokens_in: int | None, tokens_out: int | None,
                    tokens_cached: int | None = None) -> None:
        tokens = self._data.tokens
        if tokens_cached:  # of the input tokens, those read from a prompt cache
            tokens[(model, key, "cached")] = tokens.get((model, key, "cached"), 0) + tokens_cached
        if tokens_in:
            tokens[(model, key, "input")] = tokens.get((model, key, "input"), 0) + tokens_in
        if tokens_out:
            tokens[(model, key, "output")] = tokens.get((model, key, "output"), 0) + tokens_out

"""Logging pipeline (redaction, JSON lines, stdlib routing) and Prometheus metrics."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from app.observability import REDACTED, Metrics, configure_logging, redact_secrets


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.contextvars.clear_contextvars()


REDACT = [
    ("authorization", {"authorization": "Bearer sk-1"}, {"authorization": REDACTED}),
    ("case and dashes", {"X-Api-Key": "sk-1", "API-KEY": "sk-2"}, {"X-Api-Key": REDACTED, "API-KEY": REDACTED}),
    ("token, secret, password", {"token": "t", "client_secret": "s", "Password": "p"},
     {"token": REDACTED, "client_secret": REDACTED, "Password": REDACTED}),
    ("suffixes", {"admin_token": "a", "upstream_api_key": "u"}, {"admin_token": REDACTED, "upstream_api_key": REDACTED}),
    ("counts are not secrets", {"max_tokens": 5, "input_tokens": 3, "tokens": 9, "key": "team-a"},
     {"max_tokens": 5, "input_tokens": 3, "tokens": 9, "key": "team-a"}),
    ("env var names are not secrets", {"api_key_env": "UPSTREAM_KEY"}, {"api_key_env": "UPSTREAM_KEY"}),
    ("nested dict", {"headers": {"Authorization": "Bearer sk", "accept": "*/*"}, "n": 1},
     {"headers": {"Authorization": REDACTED, "accept": "*/*"}, "n": 1}),
    ("deeply nested", {"a": {"b": [{"c": {"password": "p", "ok": 1}}]}},
     {"a": {"b": [{"c": {"password": REDACTED, "ok": 1}}]}}),
    ("asgi header list", {"headers": [(b"x-api-key", b"sk"), (b"accept", b"*/*")]},
     {"headers": [(b"x-api-key", REDACTED), (b"accept", b"*/*")]}),
    ("header pair list", {"headers": [["Authorization", "Bearer sk"]]}, {"headers": [["Authorization", REDACTED]]}),
    ("tuples stay tuples", {"ids": (1, 2), "pairs": ((b"token", b"t"),)}, {"ids": (1, 2), "pairs": ((b"token", REDACTED),)}),
]


@pytest.mark.parametrize(("case", "event", "expected"), REDACT, ids=[c[0] for c in REDACT])
def test_redact_secrets(case: str, event: dict[str, Any], expected: dict[str, Any]) -> None:
    assert redact_secrets(None, "info", dict(event)) == expected


def test_redaction_leaves_the_callers_objects_alone() -> None:
    headers = {"authorization": "Bearer sk"}
    redact_secrets(None, "info", {"headers": headers})
    assert headers == {"authorization": "Bearer sk"}


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_with_context_timestamp_and_redaction(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    structlog.contextvars.bind_contextvars(request_id="req-1")
    log = structlog.get_logger("poolgate")
    log.info("worker.ready", worker="w1", api_key="sk-secret", headers={"x-api-key": "sk-secret"})
    log.debug("worker.noise")
    [line] = lines(stream)
    assert line["event"] == "worker.ready" and line["level"] == "info" and line["worker"] == "w1"
    assert line["request_id"] == "req-1"
    assert line["timestamp"].endswith("Z") and line["timestamp"][10] == "T"
    assert line["api_key"] == REDACTED and line["headers"] == {"x-api-key": REDACTED}
    assert "sk-secret" not in stream.getvalue()


def test_stdlib_logging_goes_through_the_same_pipeline(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("warning", "json", stream=stream)
    structlog.contextvars.bind_contextvars(request_id="req-2")
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.info("Started server process [%d]", 42)  # below the level
    uvicorn_log.warning("Invalid HTTP request %s", "x", extra={})
    [line] = lines(stream)
    assert line["event"] == "Invalid HTTP request x"
    assert line["logger"] == "uvicorn.error" and line["level"] == "warning"
    assert line["request_id"] == "req-2" and "timestamp" in line


def test_exceptions_are_rendered_into_the_json_line(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger().exception("gateway.unhandled_error")
    [line] = lines(stream)
    assert line["level"] == "error" and "RuntimeError: boom" in line["exception"]


def test_console_format(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("debug", "console", stream=stream)
    structlog.get_logger().debug("server.listening", url="http://127.0.0.1:1", token="t0ken")
    # a server started by an earlier test leaves uvicorn's own level on this logger
    uvicorn_error = logging.getLogger("uvicorn.error")
    saved_level = uvicorn_error.level
    uvicorn_error.setLevel(logging.NOTSET)
    try:
        uvicorn_error.info("hello from stdlib")
    finally:
        uvicorn_error.setLevel(saved_level)
    out = stream.getvalue()
    assert "server.listening" in out and "url=http://127.0.0.1:1" in out
    assert "hello from stdlib" in out and "t0ken" not in out
    assert not out.lstrip().startswith("{")


def test_reconfiguring_replaces_our_handler(restore_logging: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", stream=first)
    configure_logging("info", "json", stream=second)
    logging.getLogger("x").warning("once")
    assert first.getvalue() == "" and [entry["event"] for entry in lines(second)] == ["once"]


def test_unknown_format_is_refused(restore_logging: None) -> None:
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml")  # type: ignore[arg-type]


def samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    body, _ = metrics.render()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_metrics_render_the_observed_series() -> None:
    m = Metrics(models=["gpt-4o-mini"])
    for _ in range(2):
        m.observe_request(dialect="openai", model="gpt-4o-mini", worker="w1", key="team-a", status=200,
                          duration=0.2, ttft=0.05, tokens_in=10, tokens_out=3)
    m.observe_request(dialect="anthropic", model="made-up-by-client", worker="none", key="anonymous",
                      status=404, duration=0.001)
    m.add_tokens(model="gpt-4o-mini", key="team-a", tokens_in=1, tokens_out=None)
    m.in_flight_started("w1")
    m.in_flight_started("w1")
    m.in_flight_finished("w1")
    m.observe_upstream_error(worker="w1", kind="timeout")
    got = samples(m)
    ok = frozenset({"dialect": "openai", "model": "gpt-4o-mini", "worker": "w1", "key": "team-a",
                    "status": "200"}.items())
    assert got["poolgate_requests_total", ok] == 2
    unknown = frozenset({"dialect": "anthropic", "model": "unknown", "worker": "none", "key": "anonymous",
                         "status": "404"}.items())
    assert got["poolgate_requests_total", unknown] == 1
    openai = frozenset({"dialect": "openai", "model": "gpt-4o-mini"}.items())
    assert got["poolgate_request_duration_seconds_count", openai] == 2
    assert got["poolgate_request_duration_seconds_sum", openai] == pytest.approx(0.4)
    assert got["poolgate_time_to_first_token_seconds_count", openai] == 2
    assert got["poolgate_request_duration_seconds_bucket", openai | {("le", "0.001")}] == 0
    assert got["poolgate_request_duration_seconds_bucket", openai | {("le", "120.0")}] == 2
    tokens = {"model": "gpt-4o-mini", "key": "team-a"}
    assert got["poolgate_tokens_total", frozenset({**tokens, "direction": "input"}.items())] == 21
    assert got["poolgate_tokens_total", frozenset({**tokens, "direction": "output"}.items())] == 6
    assert got["poolgate_in_flight", frozenset({("worker", "w1")})] == 1
    assert got["poolgate_upstream_errors_total", frozenset({("worker", "w1"), ("kind", "timeout")})] == 1
    assert not any("made-up-by-client" in labels for _, labels in got)


def test_metrics_instances_do_not_share_a_registry() -> None:
    a, b = Metrics(), Metrics()
    a.observe_upstream_error(worker="w", kind="connect")
    body_a, content_type = a.render()
    body_b, _ = b.render()
    assert b'poolgate_upstream_errors_total{kind="connect",worker="w"} 1.0' in body_a
    assert b"poolgate_upstream_errors_total{" not in body_b
    assert content_type.startswith("text/plain")


@pytest.mark.parametrize(("value", "first_bucket"), [(0.0005, "0.001"), (0.001, "0.001"), (0.0011, "0.0025"),
                                                      (120.0, "120.0"), (500.0, "+Inf")])
def test_histogram_buckets_are_less_or_equal(value: float, first_bucket: str) -> None:
    m = Metrics()
    m.observe_first_token(dialect="openai", model="m", seconds=value)
    got = samples(m)
    labels = frozenset({"dialect": "openai", "model": "m"}.items())
    buckets = {dict(ls)["le"]: v for (name, ls), v in got.items()
               if name == "poolgate_time_to_first_token_seconds_bucket" and labels <= ls}
    counted = [le for le, count in buckets.items() if count == 1]
    assert counted[0] == first_bucket and buckets["+Inf"] == 1
    assert len(buckets) == 17 and got["poolgate_time_to_first_token_seconds_sum", labels] == value

"""Operations: health, readiness, metrics and admin gates, request ids, access logs."""

from __future__ import annotations

import io
import json
import time

import httpx
import openai
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from app.observability import configure_logging

from .conftest import (
    ADMIN_TOKEN, ANTHROPIC_MODEL, CLIENT_KEY, METRICS_TOKEN, OPENAI_MODEL, UPSTREAM_KEY,
)


@pytest.fixture
def http(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        yield c


def test_healthz_readyz_and_head_root(http):
    health = http.get("/healthz").json()
    assert health["status"] == "ok" and health["workers"] == {"ready": 3, "total": 3}
    assert health["in_flight"] == 0
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert set(ready.json()["models"]) >= {OPENAI_MODEL, ANTHROPIC_MODEL}
    assert http.head("/").status_code == 200  # Claude Code probes this first


def test_request_id_echoed_or_generated(http):
    auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    body = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    mine = http.post("/v1/chat/completions", json=body, headers={**auth, "x-request-id": "req-42"})
    assert mine.headers["x-request-id"] == "req-42"
    theirs = http.post("/v1/chat/completions", json=body, headers=auth)
    assert len(theirs.headers["x-request-id"]) >= 16
    refused = http.post("/v1/chat/completions", json=body, headers={"x-request-id": "req-43"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "req-43"


def test_metrics_need_their_token(http):
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers={"authorization": f"Bearer {CLIENT_KEY}"}).status_code == 401
    http.post("/v1/chat/completions", headers={"authorization": f"Bearer {CLIENT_KEY}"},
              json={"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "count me"}]})
    r = http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
    assert r.status_code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(r.text) for s in family.samples}
    requests = samples[("poolgate_requests_total", (
        ("dialect", "openai_chat"), ("key", "team-a"), ("model", OPENAI_MODEL), ("status", "200"),
        ("worker", "openai-up")))]
    assert requests >= 1
    assert samples[("poolgate_tokens_total", (("direction", "output"), ("key", "team-a"),
                                              ("model", OPENAI_MODEL)))] > 0
    assert any(name == "poolgate_request_duration_seconds_count" for name, _ in samples)
    assert samples[("poolgate_in_flight", (("worker", "openai-up"),))] == 0
    # the pool's own series
    assert samples[("poolgate_worker_state", (("state", "ready"), ("worker", "openai-up")))] == 1
    assert samples[("poolgate_worker_state", (("state", "draining"), ("worker", "openai-up")))] == 0
    assert samples[("poolgate_queue_depth", ())] == 0
    assert ("poolgate_admission_rejections_total", (("reason", "worker"),)) in samples
    assert ("poolgate_worker_restarts_total", (("worker", "openai-up"),)) in samples
    assert any(name == "poolgate_routing_decisions_total" for name, _ in samples)


def test_admin_endpoints_need_the_admin_token(http, gateway):
    assert http.get("/internal/workers").status_code == 401
    assert http.get("/internal/workers",
                    headers={"authorization": f"Bearer {CLIENT_KEY}"}).status_code == 401
    r = http.get("/internal/workers", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200
    workers = {w["name"]: w for w in r.json()["workers"]}
    assert workers["openai-up"]["state"] == "ready"
    assert workers["openai-up"]["models"] == [OPENAI_MODEL]
    assert UPSTREAM_KEY not in r.text


def test_admin_closed_without_token(fake_upstream):
    from app.factory import create_app
    from tests.support.server import ServerThread

    from .conftest import gateway_settings

    app = create_app(gateway_settings(fake_upstream, admin_token=None))
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url) as c:
        r = c.get("/internal/workers", headers={"authorization": "Bearer anything"})
    assert r.status_code == 404 and "disabled" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "not_found"  # not an unknown model


def test_access_log_line_has_the_fields_and_no_secrets(gateway):
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    try:
        with openai.OpenAI(base_url=gateway.openai_base, api_key=CLIENT_KEY, max_retries=0) as c:
            c.chat.completions.create(model=ANTHROPIC_MODEL,
                                      messages=[{"role": "user", "content": "log me"}],
                                      extra_headers={"x-request-id": "log-test-1"})
            with pytest.raises(openai.BadRequestError):
                c.chat.completions.create(model=OPENAI_MODEL,
                                          messages=[{"role": "user", "content": "[[error:400]]"}],
                                          extra_headers={"x-request-id": "log-test-2"})
        # the server thread writes the access line as the response ends, which may be just
        # after the client has it: wait for the line before logging is reset
        deadline = time.monotonic() + 5
        for rid in ('"log-test-1"', '"log-test-2"'):
            while not any(rid in line and '"http.request"' in line
                          for line in out.getvalue().splitlines()):
                assert time.monotonic() < deadline, f"no access line for {rid}"
                time.sleep(0.01)
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    ok = next(r for r in lines if r.get("request_id") == "log-test-1" and r["event"] == "http.request")
    assert ok["key"] == "team-a" and ok["dialect"] == "openai_chat"
    assert ok["model"] == ANTHROPIC_MODEL and ok["worker"] == "anthropic-up"
    assert ok["status"] == 200 and ok["latency_ms"] > 0
    assert ok["tokens_in"] > 0 and ok["tokens_out"] > 0
    failed = [r for r in lines if r.get("request_id") == "log-test-2"]
    assert any(r.get("status") == 400 and r.get("error") == "invalid_request" for r in failed)
    # every line of the request carries its id (the worker's own lines too)
    assert any(r["event"].startswith("remote.") for r in failed)
    # and the key it was identified by
    assert all(r.get("key") == "team-a" for r in failed if r["event"].startswith("remote."))
    text = out.getvalue()
    for secret in (CLIENT_KEY, UPSTREAM_KEY, ADMIN_TOKEN, METRICS_TOKEN):
        assert secret not in text

"""Auth is deny-by-default: every route in the app's route table, asked
without credentials over a real server, is refused unless it is one of the
few listed public ones; also behind a ``root_path``."""

from __future__ import annotations

import re
from typing import Any, Iterator

import httpx
import pytest
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from app.factory import create_app
from tests.support.server import ServerThread

from .conftest import ADMIN_TOKEN, CLIENT_KEY, METRICS_TOKEN, gateway_settings

# (method, path) a client may call with no credential at all
PUBLIC = {("GET", "/healthz"), ("HEAD", "/healthz"), ("GET", "/readyz"), ("HEAD", "/readyz"),
          ("HEAD", "/"), ("GET", "/internal/ui"), ("HEAD", "/internal/ui")}
PUBLIC_PREFIX = "/internal/ui/static/"
_PARAM = re.compile(r"\{[^}]+\}")


def _requests(app: Any) -> list[tuple[str, str]]:
    """One (method, concrete path) per method of every route in the table."""
    out: list[tuple[str, str]] = []
    for route in app.routes:
        if isinstance(route, Route):
            path = _PARAM.sub("probe", route.path)
            out.extend((method, path) for method in sorted(route.methods or ("GET",)))
        elif isinstance(route, Mount):
            out.append(("GET", _PARAM.sub("probe", route.path) + "/probe"))
        else:  # a new kind of route must be added here deliberately
            raise AssertionError(f"unhandled route type {type(route).__name__}")
    return out


def _is_public(method: str, path: str) -> bool:
    return (method, path) in PUBLIC or (method in ("GET", "HEAD") and path.startswith(PUBLIC_PREFIX))


async def _late_route(request: Any) -> JSONResponse:
    return JSONResponse({"secret": "data"})


@pytest.fixture(scope="module", params=["", "/gw"], ids=["no-root-path", "root-path"])
def served(request: pytest.FixtureRequest, fake_upstream: Any) -> Iterator[tuple[Any, str]]:
    app = create_app(gateway_settings(fake_upstream))
    # added after create_app, as a careless future change would: closed anyway
    app.router.routes.append(Route("/debug/late", _late_route, methods=["GET", "POST"]))
    with ServerThread(app, root_path=request.param) as server:
        yield app, server.url


def test_every_route_refuses_a_request_without_credentials(served):
    app, url = served
    requests = _requests(app)
    assert ("GET", "/debug/late") in requests and len(requests) > 20
    seen_public = set()
    with httpx.Client(base_url=url, timeout=30) as http:
        for method, path in requests:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
                r = http.request(method, path, headers=headers, content=b"{}")
                if _is_public(method, path):
                    seen_public.add((method, path))
                    # served (a 404 for the made-up asset name), never refused
                    assert r.status_code in (200, 404, 503), (method, path, r.status_code)
                else:
                    assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
                    assert "secret" not in r.text
    assert {("GET", "/healthz"), ("HEAD", "/"), ("GET", "/readyz")} <= seen_public


def test_unknown_paths_are_refused_before_routing(served):
    _, url = served
    with httpx.Client(base_url=url, timeout=30) as http:
        for method, path in (("GET", "/nope"), ("POST", "/v2/chat"), ("GET", "/"),
                             ("GET", "/internal/ui/"), ("GET", "/internal"),
                             ("OPTIONS", "/v1/chat/completions"), ("GET", "/metrics/")):
            assert http.request(method, path).status_code == 401, (method, path)
        # with the client key an unknown path is a plain 404
        assert http.get("/nope", headers={"x-api-key": CLIENT_KEY}).status_code == 404


def test_each_credential_opens_only_its_own_routes(served):
    _, url = served
    client = {"authorization": f"Bearer {CLIENT_KEY}"}
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    metrics = {"authorization": f"Bearer {METRICS_TOKEN}"}
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/v1/models", headers=client).status_code == 200
        assert http.get("/debug/late", headers=client).status_code == 200
        assert http.get("/internal/workers", headers=client).status_code == 401
        assert http.get("/metrics", headers=client).status_code == 401
        assert http.get("/internal/workers", headers=admin).status_code == 200
        assert http.get("/v1/models", headers=admin).status_code == 401
        assert http.get("/metrics", headers=admin).status_code == 401
        assert http.get("/metrics", headers=metrics).status_code == 200
        assert http.get("/internal/stats", headers=metrics).status_code == 401

"""Which credential a request needs: deny by default.

Every path needs a client API key unless it is listed here as public, or is an
operator path (``/internal/*``: the admin token; ``/metrics``: the metrics
token). A route added later is therefore closed until someone lists it, and
an unknown path is refused before the router can say whether it exists.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["ADMIN", "CLIENT", "METRICS", "PUBLIC", "required_credential", "route_path"]

PUBLIC = "public"
CLIENT = "client"
ADMIN = "admin"
METRICS = "metrics"

_READ = frozenset({"GET", "HEAD"})
# Liveness and readiness for load balancers; HEAD / because Claude Code probes
# it before its first request and gives up on anything but 200.
_PUBLIC_EXACT = {"/healthz": _READ, "/readyz": _READ, "/": frozenset({"HEAD"})}
# The operator page's static shell carries no data: its script calls the
# admin JSON endpoints with the admin token.
_UI_SHELL = "/internal/ui"
_UI_STATIC = "/internal/ui/static/"


def route_path(scope: Mapping[str, Any]) -> str:
    """The path the router matches: ``scope["path"]`` without ``root_path``
    (the same rule as Starlette's router, so the check and the route agree)."""
    path: str = scope["path"]
    root = scope.get("root_path") or ""
    if root and path.startswith(root):
        rest = path[len(root):]
        if rest == "" or rest.startswith("/"):
            return rest
    return path


def required_credential(method: str, path: str) -> str:
    """``PUBLIC``, ``ADMIN``, ``METRICS`` or ``CLIENT`` for a request."""
    if method in _PUBLIC_EXACT.get(path, ()):
        return PUBLIC
    if method in _READ and (path == _UI_SHELL or path.startswith(_UI_STATIC)):
        return PUBLIC
    if path == "/internal" or path.startswith("/internal/"):
        return ADMIN
    if path == "/metrics":
        return METRICS
    return CLIENT

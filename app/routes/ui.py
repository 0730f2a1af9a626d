"""The operator page: ``GET /internal/ui`` and ``GET /internal/ui/static/{name}``.

Static files shipped inside the ``app`` package (``app/ui/``), no build step.
They carry no data: the page asks for the admin token, keeps it in the
browser's session storage and calls the ``/internal/*`` JSON with it. So both
routes are public; everything the page shows comes from endpoints that check
the admin token themselves.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from pool.errors import NotFound

from ..http import error_response

__all__ = ["OperatorPage", "UI_PATH", "UI_STATIC_PATH"]

UI_PATH = "/internal/ui"
UI_STATIC_PATH = "/internal/ui/static/{name}"

_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}

# Only our own files run or style the page; it may talk to this origin only and
# may not be framed (the token box must not be clickjacked).
_HEADERS = {
    "content-security-policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "form-action 'none'; base-uri 'none'; frame-ancestors 'none'"),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


class OperatorPage:
    """The page and its assets, read once from the package at start-up."""

    def __init__(self) -> None:
        root = resources.files("app") / "ui"
        self.index = (root / "index.html").read_bytes()
        self.assets: dict[str, tuple[bytes, str]] = {}
        for item in (root / "static").iterdir():
            suffix = "." + item.name.rpartition(".")[2]
            if item.is_file() and suffix in _TYPES:
                self.assets[item.name] = (item.read_bytes(), _TYPES[suffix])

    async def page(self, request: Request) -> Response:
        return Response(self.index, media_type=_TYPES[".html"], headers=_HEADERS)

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        found = self.assets.get(name)
        if found is None:
            return error_response(NotFound(f"No operator page asset '{name}'."), "openai")
        body, media_type = found
        return Response(body, media_type=media_type, headers=_HEADERS)

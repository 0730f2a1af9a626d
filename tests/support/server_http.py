"""The HTTP server the tests' ``poolgate serve`` processes run on.

``TEST_SERVER_HTTP=granian pytest …`` runs every gateway process the tests
start on granian (``server.http = "granian"``, given to the process as
``POOLGATE_SERVER__HTTP``); unset, on uvicorn (the default). A gateway
started in-process by tests/support/server.py is not concerned: it is
uvicorn's ``Server`` by design."""

from __future__ import annotations

import os
from typing import Mapping

__all__ = ["SERVER_HTTP", "with_server_http"]

SERVER_HTTP = os.environ.get("TEST_SERVER_HTTP", "uvicorn")


def with_server_http(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a ``poolgate serve`` process, on the server the run asks for."""
    if SERVER_HTTP == "uvicorn":
        return dict(env)
    return {**env, "POOLGATE_SERVER__HTTP": SERVER_HTTP}

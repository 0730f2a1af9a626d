"""Pytest fixtures for tests against one real Redis server: ``server`` (a
fresh ``redis-server`` per test) and ``links`` (two :class:`RedisLink` on it,
as two replicas would hold). A test module imports both names to use them."""

from __future__ import annotations

from typing import AsyncIterator, Iterator

import pytest

from sessions.redis_link import RedisLink

from .redis_server import RedisServer

__all__ = ["server", "links"]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
async def links(server: RedisServer) -> AsyncIterator[tuple[RedisLink, RedisLink]]:
    a, b = RedisLink(server.url, probe_interval=0.05), RedisLink(server.url, probe_interval=0.05)
    assert await a.ping() and await b.ping()
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()

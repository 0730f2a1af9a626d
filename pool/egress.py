"""Is a worker's egress proxy up? A TCP connect to it, bounded.

A cli worker's CLI reaches its upstream only through the proxy (its
environment says so, :func:`pool.childenv.proxy_environment`); the gateway
cannot see inside the CLI's requests, so it checks the proxy itself on the
health interval and takes the account out while the proxy does not accept
connections, rather than let turns fail one by one. (A remote worker needs
no such check: its health probe goes through the proxy.) A CLI that cannot
reach its vendor may say "log in" (Gemini CLI does, with no way to Google):
:func:`proxy_down` tells the worker's host that it is the proxy, not the
account.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Mapping
from urllib.parse import urlsplit

from .childenv import PROXY_NAMES

__all__ = ["proxy_reachable", "proxy_down"]


async def proxy_reachable(url: str, timeout: float) -> bool:
    """True when the proxy at ``url`` accepts a TCP connection within ``timeout`` s."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    if host is None or port is None:
        return False
    try:
        async with asyncio.timeout(timeout):
            _reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def proxy_down(env: Mapping[str, str], timeout: float = 2.0) -> bool:
    """A CLI child's egress proxy (in ``env``, as :func:`pool.childenv.proxy_environment`
    puts it) does not take connections; ``False`` when it has none."""
    proxy = next((env[name] for name in PROXY_NAMES if env.get(name)), None)
    return proxy is not None and not await proxy_reachable(proxy, timeout)

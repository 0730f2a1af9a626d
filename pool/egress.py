"""Is a worker's egress proxy up? A TCP connect to it, bounded.

A cli worker's CLI reaches its upstream only through the proxy (its
environment says so, :func:`pool.childenv.proxy_environment`); the gateway
cannot see inside the CLI's requests, so it checks the proxy itself on the
health interval and takes the account out while the proxy does not accept
connections, rather than let turns fail one by one. (A remote worker needs
no such check: its health probe goes through the proxy.) A CLI that cannot
reach its vendor may say "log in" (Gemini CLI does, with no way to Google):
the worker's host checks the proxy then, so a proxy that is down is not
taken for a logged-out account.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

__all__ = ["proxy_reachable"]


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


"""OpenAI and Anthropic SDK clients closed when the test ends.

An SDK client left open holds its kept-alive connection's socket inside a
reference cycle (the client and its resource objects point at each other),
so only the cyclic garbage collector frees it: whenever it next runs, often
minutes later during an unrelated test. It may finalize the socket before the
client's own ``__del__`` closes it, and the socket's ResourceWarning
("unclosed <socket.socket ... raddr=('127.0.0.1', <the gateway's port>)>")
then fails that other test, since warnings are errors.

So a test closes every sync client it makes: with ``with``, or by handing it to
:func:`closed_at_end` where a ``with`` is awkward (a helper that returns the
answer, not the client). An async client closes with ``async with`` on its own
loop. ``tests/unit/test_sdk_clients_closed.py`` checks every test file for this.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["close_all", "closed_at_end"]

C = TypeVar("C")

_OPEN: list[Any] = []


def closed_at_end(client: C) -> C:
    """``client`` (a sync SDK client), closed by ``tests/conftest.py`` when the
    running test ends."""
    _OPEN.append(client)
    return client


def close_all() -> None:
    """Closes every client handed to :func:`closed_at_end` so far."""
    while _OPEN:
        _OPEN.pop().close()

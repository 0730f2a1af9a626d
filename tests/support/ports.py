"""Free loopback ports for servers started as real subprocesses."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS picked it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

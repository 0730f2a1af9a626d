"""A real ``redis-server`` on a free loopback port, without persistence, for tests.

``RedisServer.start()`` waits for the first PING; ``kill()`` is SIGKILL (an
outage); ``start()`` again brings it back on the same port, empty.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import redis

from .ports import free_port

__all__ = ["RedisServer", "require_redis_server"]


def require_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; "
                    "the Makefile's sysdeps target installs it)")
    return path


class RedisServer:
    def __init__(self) -> None:
        self.binary = require_redis_server()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="poolgate-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
             "--logfile", f"{self.dir}/log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.005)
        finally:
            client.close()

    def client(self) -> redis.Redis:
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        return redis.Redis(port=self.port, retry=Retry(NoBackoff(), 0), socket_timeout=1.0)

    def kill(self) -> None:
        """SIGKILL: the outage the gateway must survive."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.proc = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

"""A real poolgate process (``python -m app.cli serve``) on a free loopback port,
for tests where replicas or deployments must be separate processes: its
config is TOML text, its environment exactly what the test gives (no
``POOLGATE_*`` of the runner's), and its log lines go to a file to read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

import httpx

from .paths import REPO
from .ports import free_port
from .server_http import with_server_http

__all__ = ["GatewayProcess"]


class GatewayProcess:
    """``GatewayProcess(tmp, "a", toml_text, env)``: ``{port}`` in the text is
    replaced by the port; ready once ``/healthz`` answers."""

    def __init__(self, tmp: Path, name: str, config: str, env: Mapping[str, str],
                 start_timeout: float = 30.0) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = tmp / f"{name}.toml"
        path.write_text(config.replace("{port}", str(self.port)))
        self.log_path = tmp / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("POOLGATE_")}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve", "--config", str(path)], cwd=REPO,
                env=with_server_http({**base, **env}), stdout=log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=self.url, timeout=10)
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if self.http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"gateway {name} did not start:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

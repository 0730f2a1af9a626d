"""The cli worker child: ``python -m pool.cli`` (configuration in ``POOLGATE_CLI_CONFIG``).

Builds the account's driver, starts it, then serves the worker protocol
(:mod:`pool.worker_main`) with a :class:`~pool.cli.host.CliHost` until the
gateway closes the socket or sends SIGTERM; every vendor process is closed on
the way out. The configuration travels in the environment, not in argv: it
holds the CLI's environment, secrets included, and argv is world-readable.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import orjson
import structlog

from .. import worker_main
from ..dumpable import undumpable
from .driver import DriverConfig, DriverError
from .host import CliHost
from .private import private_dir
from .registry import make_driver
from .scrub import account_secrets, scrub
from .sandbox import Sandbox

ENV_CONFIG = "POOLGATE_CLI_CONFIG"
EXIT_REFUSED = 78  # EX_CONFIG: the driver refused to start (the log and last_exit say why)
log = structlog.get_logger("pool.cli")


def driver_config(data: dict[str, Any]) -> DriverConfig:
    command = data.get("command")
    return DriverConfig(
        name=data["name"], cli=data["cli"], home=data["home"], cwd=data["cwd"],
        command=tuple(command) if command else None, env=dict(data.get("env") or {}),
        mode=data.get("mode", "chat"), max_conversations=int(data.get("max_conversations", 4)),
        options=dict(data.get("options") or {}), tool_timeout=float(data.get("tool_timeout", 300)),
        idle_timeout=float(data.get("idle_timeout", 300)),
        workspace_root=data.get("workspace_root") or "",
        sandbox=Sandbox.from_dict(data.get("sandbox")), proxy=data.get("proxy") or None)


async def _main(data: dict[str, Any]) -> None:
    config = driver_config(data)
    # what the vendor CLI writes into the account's home (credentials, sessions) is
    # private too, whatever umask the gateway was started with
    os.umask(0o077)
    private_dir(config.home)
    private_dir(config.cwd)
    driver = make_driver(config)
    if hasattr(driver, "on_process_exit"):
        # one vendor process serves every conversation (Codex): when it dies, so does
        # this child, and the supervisor restarts the account with backoff
        driver.on_process_exit = lambda: os.kill(os.getpid(), signal.SIGTERM)
    host = CliHost(driver, config,
                   conversation_idle=float(data.get("conversation_idle", 900)),
                   login_recheck=float(data.get("login_recheck", 5)))
    async def start() -> None:
        try:
            await host.start()
        except DriverError as exc:  # its text may quote the vendor (an error, stderr)
            raise DriverError(scrub(str(exc), account_secrets(config.home, config.env))) \
                from None

    try:
        await worker_main.serve(host.answer, setup=start, refused=(DriverError,),
                                calls={"status": host.status, "probe_login": host.probe_login})
    except DriverError as exc:
        # the account cannot run as it is on disk or configured: say why (in the log,
        # and to the gateway: last_exit.detail in /internal/workers) and exit with
        # EX_CONFIG; the supervisor backs off
        log.error("cli.start_refused", worker=config.name, cli=config.cli, reason=str(exc))
        raise SystemExit(EXIT_REFUSED) from None
    finally:
        await host.aclose()


def main() -> None:
    worker_main.guard_parent()
    undumpable()  # the CLI's tools must not read this child's environment (its config)
    data = orjson.loads(os.environ.pop(ENV_CONFIG))
    try:
        asyncio.run(_main(data))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

"""``cli = "claude" | "codex" | "qwen" | "gemini" | "jsonrpc"`` → the driver class.

Drivers are imported by path, lazily: a worker child imports only its own CLI's
driver, and a driver module can be added without touching the others."""

from __future__ import annotations

import importlib

from .driver import CliDriver, DriverConfig, DriverError

__all__ = ["DRIVERS", "CLIS", "make_driver"]

DRIVERS: dict[str, str] = {
    "claude": "pool.cli.claude:ClaudeDriver",
    "codex": "pool.cli.codex:CodexDriver",
    "qwen": "pool.cli.qwen:QwenDriver",
    "jsonrpc": "pool.cli.jsonrpc:JsonRpcDriver",
    "gemini": "pool.cli.gemini:GeminiDriver",
}
CLIS = tuple(DRIVERS)


def make_driver(config: DriverConfig) -> CliDriver:
    """The driver for ``config.cli``; raises DriverError when there is none."""
    path = DRIVERS.get(config.cli)
    if path is None:
        raise DriverError(f"no driver for cli {config.cli!r} (one of {', '.join(CLIS)})")
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise DriverError(f"the {config.cli} driver is not available in this build") from None
    driver: CliDriver = getattr(module, class_name)(config)
    return driver

"""The local worker child: ``python -m pool.local --config JSON``.

Loads one engine, then serves the worker protocol (:mod:`pool.worker_main`),
answering pings with the engine's health and progress (:mod:`pool.local.health`),
until the gateway closes the socket or sends SIGTERM; the engine is closed on
the way out (an engine server it started goes with it)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from .. import worker_main
from ..wire import request_from_dict
from .chat import LocalChat
from .engines import make_engine
from .health import EngineWatch
from .sampling import resolve_defaults


async def _main(config: dict[str, Any]) -> None:
    engine = make_engine(config)
    watch = EngineWatch(engine, read_timeout=float(config.get("read_timeout") or 120.0),
                        check_timeout=float(config.get("check_timeout") or 2.5))
    chat = LocalChat(engine, config.get("served_name") or "local", watch,
                     resolve_defaults(config.get("sampling_defaults"), str(config["model"])))

    async def count_tokens(params: Any) -> int:
        return await asyncio.to_thread(chat.count_tokens, request_from_dict(params))

    async def stats(params: Any) -> dict[str, Any]:
        return {"engine": engine.name, "active": getattr(engine, "active", None),
                "context_length": engine.context_length,
                "sampling_defaults": chat.defaults.as_dict()}

    try:
        await worker_main.serve(chat.stream, setup=engine.start,
                                calls={"count_tokens": count_tokens, "stats": stats},
                                health=watch.unhealthy)
    finally:
        await watch.aclose()
        await engine.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pool.local")
    parser.add_argument("--config", required=True, help="the worker's engine configuration (JSON)")
    args = parser.parse_args(argv)
    worker_main.guard_parent()
    try:
        asyncio.run(_main(orjson.loads(args.config)))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

"""``poolgate`` command line: ``serve``, ``check-config``, ``version``, ``join``.

This is the one place that touches ``os.environ``: it hands it to
``load_settings`` explicitly.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any, TextIO

import structlog

from app.join import add_join_parser, join
from app.settings import ConfigError, Settings, check_config, load_settings

__all__ = ["main", "build_parser", "build_server", "serve_overrides", "insecure_refusal"]

EXIT_OK = 0
EXIT_CONFIG = 1
EXIT_REFUSED = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="poolgate", description="One gateway, many LLM workers.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", metavar="FILE", help="TOML config file (default: $POOLGATE_CONFIG)")
    serve.add_argument("--host", help="address to listen on (overrides server.host)")
    serve.add_argument("--port", type=int, help="port to listen on (overrides server.port)")
    serve.add_argument("--demo", action="store_true",
                       help="with no workers configured, serve the built-in demo upstream (models "
                            "'demo' and 'demo-claude') instead of the embedded default model")
    serve.add_argument("--insecure", action="store_true",
                       help="allow a non-loopback host without API keys (server.allow_insecure)")
    serve.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"),
                       help="overrides server.log_level")
    serve.add_argument("--log-format", choices=("json", "console"), help="overrides server.log_format")

    check = commands.add_parser("check-config", help="report every problem in a config file")
    check.add_argument("file", metavar="FILE")

    commands.add_parser("version", help="print the version")
    add_join_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else EXIT_REFUSED
    if args.command == "version":
        print(f"poolgate {_version()}")
        return EXIT_OK
    if args.command == "check-config":
        return _check_config(args.file, os.environ, sys.stdout)
    if args.command == "join":
        return join(args, os.environ, sys.stdout)
    return _serve(args, os.environ)


def _version() -> str:
    try:
        return metadata.version("poolgate")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _check_config(path: str, environ: Mapping[str, str], out: TextIO) -> int:
    problems = check_config(path, environ)
    for problem in problems:
        print(problem, file=out)
    if problems:
        return EXIT_CONFIG
    print("ok", file=out)
    return EXIT_OK


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``[server]`` fields the command line sets (the top layer of the settings)."""
    server: dict[str, Any] = {}
    for flag, field in (("host", "host"), ("port", "port"), ("log_level", "log_level"), ("log_format", "log_format")):
        value = getattr(args, flag)
        if value is not None:
            server[field] = value
    if args.insecure:
        server["allow_insecure"] = True
    if getattr(args, "demo", False):
        server["demo"] = True
    return {"server": server} if server else {}


def insecure_refusal(settings: Settings) -> str | None:
    """Why ``serve`` must not start with these settings, or None."""
    server = settings.server
    if server.needs_insecure_opt_in and not server.allow_insecure:
        return (
            f"refusing to listen on {server.host} with no API keys configured: anyone who can reach it "
            "could use the pool. Set server.api_keys (or POOLGATE_API_KEYS), listen on 127.0.0.1, "
            "or pass --insecure (server.allow_insecure = true) if that is really what you want."
        )
    return None


def _serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    try:
        settings = load_settings(args.config, environ, serve_overrides(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"poolgate: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    refusal = insecure_refusal(settings)
    if refusal:
        print(f"poolgate: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    from app.factory import worker_specs
    from pool.local.defaults import NoDefaultModel

    try:
        worker_specs(settings)  # finds (or fetches) the default model before the server starts
    except NoDefaultModel as exc:
        print(f"poolgate: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    from app.observability import configure_logging

    configure_logging(settings.server.log_level, settings.server.log_format, cache_loggers=True,
                      batch_access=True)
    return _run(settings)


def _run(settings: Settings) -> int:
    from app.factory import create_app

    if settings.server.http == "granian":
        from app import granian_server

        problem = granian_server.missing()
        if problem is not None:
            print(f"poolgate: {problem}", file=sys.stderr)
            return EXIT_CONFIG
        granian_server.serve(create_app(settings), settings, _listening, _stopped)
        return EXIT_OK
    server = build_server(create_app(settings), settings)
    server.run()
    return EXIT_OK


def _listening(url: str) -> None:
    """The server has started and listens on ``url``."""
    _settle_gc()
    structlog.get_logger("poolgate").info("server.listening", url=url,
                                          message=f"poolgate listening on {url}")


def _stopped() -> None:
    """Every request has ended: write the access lines still buffered."""
    from app import access_log
    access_log.close()


def build_server(app: Any, settings: Settings) -> Any:
    """The uvicorn server for ``app``, configured from ``settings`` (not started)."""
    import uvicorn  # lazily, so `check-config` and `version` stay quick

    from app.protocol_check import lean_protocol

    server = settings.server
    config = uvicorn.Config(
        # the lean protocol if its self-test passes on this uvicorn (logged), else uvicorn's own
        app, host=server.host, port=server.port, loop="uvloop", http=lean_protocol(),
        access_log=False, log_config=None, log_level=server.log_level, lifespan="on",
        timeout_graceful_shutdown=server.shutdown_timeout,
        # nothing reads the client's address: no X-Forwarded-* scan on every request
        proxy_headers=False,
    )
    return _announcing_server_class()(config)


# Young-generation collections every this many allocations (Python's default: 700).
GC_GEN0_THRESHOLD = 20_000


def _settle_gc() -> None:
    """Once started: move what start-up built (modules, settings, the app) out of
    the collector's sight, and collect the young generation ~30 times less often.
    A request allocates a few hundred objects and frees nearly all of them by
    reference counting; at the default threshold the collector ran every couple
    of requests and rescanned the whole heap every few hundred: about a tenth of
    the gateway's CPU per non-stream request on the bench's mock upstream
    (0.17 -> 0.15 ms), and 30-43 % of its CPU with thousands of open streams (half
    the CPU to open 3,000 of them at 20,000; bench/README.md). Cycles are still
    collected."""
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)


def _announcing_server_class() -> type:
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        """uvicorn's server, logging the address it actually bound (port 0 included) once started."""

        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.started:
                return
            for srv in self.servers:
                for sock in srv.sockets:
                    host, port = sock.getsockname()[:2]
                    shown = f"[{host}]" if ":" in host else host
                    _listening(f"http://{shown}:{port}")

        async def shutdown(self, sockets: list | None = None) -> None:
            await super().shutdown(sockets=sockets)
            # now, since uvicorn re-raises a SIGTERM once serve() returns (the
            # default action ends the process before anything after run() would run)
            _stopped()

    return AnnouncingServer



if __name__ == "__main__":
    sys.exit(main())

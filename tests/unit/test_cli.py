"""The poolgate command line: argument handling, config checks, the serve guard."""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path

import httpx
import pytest
import structlog
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from app.cli import build_parser, build_server, insecure_refusal, main, serve_overrides
from app.protocol import LeanHttpToolsProtocol
from app.settings import ServerSettings, Settings, load_settings

GOOD = """
[server]
port = 8123

[[workers]]
name = "up"
dialect = "openai"
url = "http://127.0.0.1:9000/v1"
api_key_env = "CLI_TEST_UPSTREAM_KEY"
models = ["m"]
"""

BAD = """
[server]
port = "eighty"
typo = 1

[[workers]]
name = "up"
kind = "local"
dialect = "openai"
url = "http://127.0.0.1:9000/v1"
models = ["m"]
"""


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() reads os.environ by design; keep the developer's POOLGATE_* out of these tests.
    for name in list(os.environ):
        if name.startswith("POOLGATE_"):
            monkeypatch.delenv(name)


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "poolgate.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("poolgate ")


def test_check_config_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLI_TEST_UPSTREAM_KEY", "k")
    assert main(["check-config", config(tmp_path, GOOD)]) == 0
    assert capsys.readouterr().out == "ok\n"


def test_check_config_reports_each_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", config(tmp_path, BAD)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "server.port: Input should be a valid integer, unable to parse string as an integer",
        "server.typo: unknown key",
        "workers[0]: a local worker needs an engine ('llamacpp', 'transformers', 'vllm' or 'sglang')",
    ]


def test_check_config_needs_the_upstream_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", config(tmp_path, GOOD)]) == 1
    assert "CLI_TEST_UPSTREAM_KEY is not set" in capsys.readouterr().out


def test_check_config_names_an_agent_worker_without_a_sandbox(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no setpriv here
    worker = (f'[[workers]]\nname = "claude-a"\nkind = "cli"\ncli = "claude"\n'
              f'models = ["m"]\nhome = "{tmp_path / "home"}"\nmode = "agent"\n'
              f'sandbox = "bwrap"\n')
    assert main(["check-config", config(tmp_path, worker)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("workers[0].sandbox: worker claude-a: agent mode needs a sandbox")
    assert "bwrap is not on PATH" in out


def test_check_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "nope.toml")]) == 1
    assert "config file not found" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["serve", "--port", "eighty"], ["check-config"],
                                  ["serve", "--log-level", "loud"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: poolgate" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    assert "--insecure" in capsys.readouterr().out


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_serve_refuses_public_host_without_keys(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--host", host]) == 2
    err = capsys.readouterr().err
    assert f"refusing to listen on {host} with no API keys" in err and "--insecure" in err


def test_serve_refuses_public_host_from_the_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLI_TEST_UPSTREAM_KEY", "k")
    path = config(tmp_path, GOOD.replace("port = 8123", 'port = 8123\nhost = "0.0.0.0"'))
    assert main(["serve", "--config", path]) == 2
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err


def test_serve_with_bad_config_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", config(tmp_path, BAD)]) == 1
    assert "poolgate: server.typo: unknown key" in capsys.readouterr().err.splitlines()


def test_serve_flags_become_the_top_layer() -> None:
    args = build_parser().parse_args(
        ["serve", "--host", "0.0.0.0", "--port", "9", "--insecure", "--log-level", "debug", "--log-format", "console"])
    overrides = serve_overrides(args)
    assert overrides == {"server": {"host": "0.0.0.0", "port": 9, "log_level": "debug", "log_format": "console",
                                    "allow_insecure": True}}
    settings = load_settings(None, {"POOLGATE_SERVER__PORT": "1"}, overrides)
    assert settings.server.port == 9 and insecure_refusal(settings) is None
    assert serve_overrides(build_parser().parse_args(["serve"])) == {}


REFUSALS = [
    ("loopback, no keys", ServerSettings(), False),
    ("public, no keys", ServerSettings(host="0.0.0.0"), True),
    ("public, keys", ServerSettings(host="0.0.0.0", api_keys={"a": "k"}), False),
    ("public, allowed", ServerSettings(host="0.0.0.0", allow_insecure=True), False),
]


@pytest.mark.parametrize(("case", "server", "refused"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_insecure_refusal(case: str, server: ServerSettings, refused: bool) -> None:
    assert (insecure_refusal(Settings(server=server)) is not None) is refused


async def test_built_server_announces_the_bound_address() -> None:
    app = Starlette(routes=[Route("/ping", lambda request: PlainTextResponse("pong"))])
    server = build_server(app, Settings(server=ServerSettings(host="127.0.0.1", port=0, shutdown_timeout=1)))
    assert (server.config.access_log, server.config.lifespan, server.config.http) == (
        False, "on", LeanHttpToolsProtocol)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(server.serve())
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    await asyncio.sleep(0.01)
            [listening] = [entry for entry in logs if entry["event"] == "server.listening"]
            port = server.servers[0].sockets[0].getsockname()[1]
            assert listening["url"] == f"http://127.0.0.1:{port}"
            assert listening["message"] == f"poolgate listening on http://127.0.0.1:{port}"
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"{listening['url']}/ping")).text == "pong"
        finally:
            server.should_exit = True
            await task

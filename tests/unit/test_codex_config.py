"""Codex driver pieces without a process: argv, binary lookup, Codex's shapes
of canonical messages, and how its errors (as recorded from 0.169.0) are read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pool.cli.codex_config import (
    CodexOptions, app_server_argv, history_items, native_binary, user_input,
)
from pool.cli.codex_thread import error_class, http_status, reset_at
from pool.cli.driver import DriverError
from pool.model import ImagePart, Message, TextPart, ToolCallPart, ToolResultPart


def _executable(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_node_shim_is_replaced_by_the_native_binary(tmp_path: Path) -> None:
    modules = tmp_path / "node_modules"
    shim = _executable(modules / "@openai" / "codex" / "bin" / "codex.js", "#!/usr/bin/env node\n")
    native = _executable(modules / "@openai" / "codex-linux-x64" / "vendor" /
                         "x86_64-unknown-linux-musl" / "bin" / "codex")
    link = modules / ".bin" / "codex"
    link.parent.mkdir()
    link.symlink_to(shim)

    assert native_binary(["codex"], {"PATH": str(link.parent)}) == [str(native)]
    assert native_binary([str(link), "--x"], {}) == [str(native), "--x"]


def test_a_plain_binary_is_used_as_is(tmp_path: Path) -> None:
    binary = _executable(tmp_path / "codex")
    assert native_binary(["codex"], {"PATH": str(tmp_path)}) == [str(binary)]
    with pytest.raises(DriverError, match="not found"):
        native_binary(["codex"], {"PATH": str(tmp_path / "none")})


def test_shim_without_platform_package_is_a_driver_error(tmp_path: Path) -> None:
    shim = _executable(tmp_path / "@openai" / "codex" / "bin" / "codex.js")
    with pytest.raises(DriverError, match="no native binary"):
        native_binary([str(shim)], {})


def test_chat_mode_turns_codex_features_off_and_options_win() -> None:
    options = CodexOptions({"config": {"model_provider": "fake", "web_search": "live"},
                            "features": {"apps": True}})
    argv = app_server_argv(["codex"], chat=True, options=options)

    assert argv[:2] == ["codex", "app-server"]
    pairs = {argv[i + 1] for i, a in enumerate(argv) if a == "-c"}
    assert {'features.plugins=false', 'skills.bundled.enabled=false',
            'include_permissions_instructions=false', 'model_provider="fake"',
            'web_search="live"'} <= pairs
    assert 'web_search="disabled"' not in pairs
    flags = [(a, argv[i + 1]) for i, a in enumerate(argv) if a in ("--enable", "--disable")]
    assert ("--disable", "shell_tool") in flags and ("--enable", "apps") in flags
    assert ("--disable", "apps") not in flags
    agent = app_server_argv(["codex"], chat=False, options=CodexOptions({}))
    assert "--disable" not in agent and 'features.plugins=false' in agent


@pytest.mark.parametrize(("options", "message"), [
    ({"nope": 1}, "cli_options.nope"),
    ({"config": {"a": {"b": 1}}}, "cli_options.config.a"),
    ({"features": {"apps": "yes"}}, "cli_options.features"),
    ({"tool_gather_seconds": -1}, "cli_options.tool_gather_seconds"),
])
def test_bad_options_name_the_option(options: dict, message: str) -> None:
    with pytest.raises(DriverError, match=message.replace(".", r"\.")):
        CodexOptions(options)


def test_history_becomes_responses_items() -> None:
    history = (
        Message("system", (TextPart("be kind"),)),
        Message("user", (TextPart("look"), ImagePart(data="AAAA", media_type="image/png"))),
        Message("assistant", (TextPart("calling"), ToolCallPart("c1", "f", '{"a":1}'))),
        Message("user", (ToolResultPart("c1", (TextPart("r1"),)), TextPart("thanks"))),
    )
    assert history_items(history) == [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "be kind"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "calling"}]},
        {"type": "function_call", "name": "f", "arguments": '{"a":1}', "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "r1"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]
    turn = (Message("user", (TextPart("hi"), ImagePart(url="https://x/y.png"))),)
    assert user_input(turn) == [{"type": "text", "text": "hi"},
                                {"type": "image", "url": "https://x/y.png"}]


# error payloads as the real app-server sent them (0.169.0)
UNAUTHORIZED_RETRY = {"message": "Reconnecting... 1/5",
                      "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 401}}}
UNAUTHORIZED_FINAL = {"message": "unexpected status 401 Unauthorized: Incorrect API key",
                      "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 401}}}
RATE_RETRY = {"message": "Reconnecting... 1/5",
              "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 429}}}
USAGE = {"message": "You\u2019ve hit your usage limit. … or try again at 7:38 AM.",
         "codexErrorInfo": "usageLimitExceeded"}
SERVER = {"message": "x", "codexErrorInfo": {"responseTooManyFailedAttempts": {
    "httpStatusCode": 500}}}


@pytest.mark.parametrize(("error", "kind", "status"), [
    (UNAUTHORIZED_RETRY, "login", 401), (UNAUTHORIZED_FINAL, "login", 401),
    ({"message": "x", "codexErrorInfo": "unauthorized"}, "login", None),
    (RATE_RETRY, "rate", 429), (USAGE, "rate", None),
    ({"message": "x", "codexErrorInfo": "rateLimitExceeded"}, "rate", None),
    (SERVER, "other", 500), ({"message": "x"}, "other", None),
])
def test_codex_errors_are_classified(error: dict, kind: str, status: int | None) -> None:
    assert error_class(error) == kind
    assert http_status(error.get("codexErrorInfo")) == status


def test_reset_time_is_the_next_such_local_time() -> None:
    now = time.mktime((2026, 11, 24, 6, 30, 0, 0, 0, -1))
    assert reset_at(USAGE["message"], now) == now + 68 * 60
    assert reset_at("try again at 6:00 AM", now) == now - 30 * 60 + 24 * 3600
    assert reset_at("try again at 12:05 PM", now) == now + (5 * 60 + 35) * 60
    assert reset_at("no time in here", now) is None

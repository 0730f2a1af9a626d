"""Qwen, Codex and Gemini cli workers given a history their CLI never saw
(another account's, a restart's, a fresh session's) that ends in the model's
tool call and the client's result: what reaches the model, and the answer,
from the real openai and anthropic SDKs through a real poolgate. Each runs on
the fake CLI and, under the ``cli`` marker, on the real binary against the
same fake upstream.

* Qwen gets the history as its own session with the call and the result as
  Qwen records them, and continues that turn (``continue_last_turn``): the
  model gets the assistant's ``tool_calls`` and the ``tool`` message as sent.
  (Before: the call was written as text and the result sent as a user
  message, which Qwen turns into the JSON of the block.)
* Codex gets them injected into a new thread (``thread/inject_items``) and an
  empty turn: ``function_call`` and ``function_call_output`` as sent.
* Gemini (ACP, no session files) gets the history flattened into its first
  prompt: the result's text is in it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.settings import WorkerSettings
from tests.fakes.gemini_cli_upstream import GeminiCliUpstream
from tests.fakes.responses_upstream import ResponsesUpstream
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import CODEX, GEMINI_CLI, GEMINI_PREFIX, QWEN_CODE, ensure_cli
from tests.support.cli_accounts import wait_for
from tests.support.cli_fakes import (ADMIN, anthropic_client, fake_cli_worker, openai_client,
                                     serve, worker_info)
from tests.support.codex_accounts import CODEX_MODEL, FAKE_CODEX, codex_home, codex_worker

pytestmark = pytest.mark.slow

KEY = "sk-rebuilt-account"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_OAI = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA}}]
WEATHER_ANT = [{"name": "get_weather", "description": "Weather for a city", "input_schema": SCHEMA}]
OPENAI_HISTORY = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Snow -3C"}]
ANTHROPIC_HISTORY = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Rain 12C"}]}]
CLI = pytest.param("real", marks=pytest.mark.cli)


def _npm_cli(package: tuple[str, str], **prefix: Path) -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the real CLI")
    path = ensure_cli(*package, **prefix)
    assert path is not None
    return path


def _env(**values: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values}


def _stats(http: httpx.Client, worker: str) -> dict[str, int]:
    return http.get("/internal/stats", headers=ADMIN).json()["cli_sessions"]["workers"].get(
        worker, {})


def _ready(http: httpx.Client, worker: str) -> None:
    wait_for(lambda: worker_info(http)[worker]["state"] == "ready", timeout=60)


# --- Qwen Code --------------------------------------------------------------------------------

QWEN_MODEL = "qwen3-coder-plus"


def _qwen(kind: str, tmp_path: Path, upstream: FakeUpstream) -> WorkerSettings:
    if kind == "fake":
        return fake_cli_worker("qwen", "qwen-a", tmp_path / "acct", upstream.url,
                               tmp_path / "qwen.log", api_key=KEY, models=(QWEN_MODEL,))
    return WorkerSettings(name="qwen-a", kind="cli", cli="qwen", models=(QWEN_MODEL,),
                          home=str(tmp_path / "acct"), command=(_npm_cli(QWEN_CODE),),
                          ready_timeout=60, env=_env(OPENAI_BASE_URL=upstream.url,
                                                     OPENAI_API_KEY=KEY))


def _tail(upstream: FakeUpstream) -> list[dict[str, Any]]:
    """The last upstream request's messages after the user's first one."""
    messages = upstream.last.body["messages"]
    return messages[next(i for i, m in enumerate(messages) if "weather?" in json.dumps(m)) + 1:]


@pytest.mark.parametrize("kind", ["fake", CLI])
def test_qwen_openai_a_rebuilt_tool_turn_gets_the_clients_result(tmp_path, kind):
    with FakeUpstream(api_key=KEY, models=(QWEN_MODEL,)) as upstream:
        with serve(_qwen(kind, tmp_path, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http, openai_client(srv) as oai:
            _ready(http, "qwen-a")
            answer = oai.chat.completions.create(model=QWEN_MODEL, messages=OPENAI_HISTORY,
                                                 tools=WEATHER_OAI, timeout=60)
            assert answer.choices[0].message.content == "tool said: Snow -3C"
            assert answer.choices[0].finish_reason == "stop"
            assert _tail(upstream) == [
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function", "function": {
                        "name": "mcp__gw__get_weather", "arguments": '{"city":"Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "call_1",
                 "content": [{"type": "text", "text": "Snow -3C"}]}]
            # the conversation goes on in the same process
            again = oai.chat.completions.create(model=QWEN_MODEL, tools=WEATHER_OAI, timeout=60,
                                                messages=[*OPENAI_HISTORY, {
                                                    "role": "assistant",
                                                    "content": "tool said: Snow -3C"},
                                                    {"role": "user", "content": "thanks"}])
            assert again.choices[0].message.content == "echo: thanks"
            assert wait_for(lambda: _stats(http, "qwen-a") == {
                "hits": 1, "misses": 0, "rebuilds": 1})


@pytest.mark.parametrize("kind", ["fake", CLI])
def test_qwen_anthropic_rebuilt_results_and_a_note_reach_the_model(tmp_path, kind):
    note = [*ANTHROPIC_HISTORY[:2], {"role": "user", "content": [
        *ANTHROPIC_HISTORY[2]["content"], {"type": "text", "text": "in Celsius please"}]}]
    with FakeUpstream(api_key=KEY, models=(QWEN_MODEL,)) as upstream:
        with serve(_qwen(kind, tmp_path, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http, anthropic_client(srv) as ant:
            _ready(http, "qwen-a")
            answer = ant.messages.create(model=QWEN_MODEL, max_tokens=256, tools=WEATHER_ANT,
                                         messages=ANTHROPIC_HISTORY, timeout=60)
            assert answer.content[-1].text == "tool said: Rain 12C"
            assert _tail(upstream)[-1] == {"role": "tool", "tool_call_id": "toolu_1",
                                           "content": [{"type": "text", "text": "Rain 12C"}]}
            with ant.messages.stream(model=QWEN_MODEL, max_tokens=256, tools=WEATHER_ANT,
                                     messages=note, timeout=60) as stream:
                text = "".join(stream.text_stream)
    assert text == "echo: in Celsius please"
    tail = _tail(upstream)
    assert tail[1] == {"role": "tool", "tool_call_id": "toolu_1",
                       "content": [{"type": "text", "text": "Rain 12C"}]}
    assert "in Celsius please" in json.dumps(tail[2:])
    assert '"type":"tool_result"' not in json.dumps(tail, separators=(",", ":"))


@pytest.mark.parametrize("kind", ["fake", CLI])
def test_qwen_rebuilt_history_keeps_an_answered_tool_round_as_tool_messages(tmp_path, kind):
    history = [*OPENAI_HISTORY, {"role": "assistant", "content": "tool said: Snow -3C"},
               {"role": "user", "content": "and tomorrow?"}]
    with FakeUpstream(api_key=KEY, models=(QWEN_MODEL,)) as upstream:
        with serve(_qwen(kind, tmp_path, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http, openai_client(srv) as oai:
            _ready(http, "qwen-a")
            answer = oai.chat.completions.create(model=QWEN_MODEL, messages=history,
                                                 tools=WEATHER_OAI, timeout=60)
    assert answer.choices[0].message.content == "echo: and tomorrow?"
    tail = _tail(upstream)
    assert [m["role"] for m in tail] == ["assistant", "tool", "assistant", "user"]
    assert tail[1]["content"] == [{"type": "text", "text": "Snow -3C"}]
    assert tail[3]["content"][-1] == {"type": "text", "text": "and tomorrow?"}


def test_qwen_that_cannot_continue_a_rebuilt_turn_fails_it_at_once(tmp_path):
    with FakeUpstream(api_key=KEY, models=(QWEN_MODEL,)) as upstream:
        worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "acct", upstream.url,
                                 tmp_path / "qwen.log", api_key=KEY, models=(QWEN_MODEL,),
                                 env={"FAKE_QWEN_NO_CONTINUE": "1"}, idle_timeout=60)
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http, \
                openai_client(srv) as oai:
            _ready(http, "qwen-a")
            with pytest.raises(openai.InternalServerError) as failed:
                oai.chat.completions.create(model=QWEN_MODEL, messages=OPENAI_HISTORY,
                                            tools=WEATHER_OAI, timeout=20)
            assert failed.value.status_code == 502
            assert worker_info(http)["qwen-a"]["in_flight"] == 0
            # the account serves the next conversation
            fresh = oai.chat.completions.create(model=QWEN_MODEL, timeout=60, messages=[
                {"role": "user", "content": "hello"}])
            assert fresh.choices[0].message.content == "echo: hello"
    assert upstream.last.body["messages"][-1]["content"][-1]["text"] == "hello"


# --- Codex ------------------------------------------------------------------------------------

def _codex(kind: str, tmp_path: Path, upstream: ResponsesUpstream) -> WorkerSettings:
    command = FAKE_CODEX if kind == "fake" else (_npm_cli(CODEX),)
    return codex_worker("codex-a", codex_home(tmp_path / "a", KEY), upstream.url,
                        command=command)


def _codex_tail(upstream: ResponsesUpstream) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "id"}
            for item in upstream.responses[-1].body["input"][-2:]]


@pytest.mark.parametrize("kind", ["fake", CLI])
def test_codex_a_rebuilt_tool_turn_gets_the_clients_result(tmp_path, kind):
    with ResponsesUpstream(api_key=KEY, models=(CODEX_MODEL,)) as upstream:
        with serve(_codex(kind, tmp_path, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            _ready(http, "codex-a")
            with openai_client(srv) as oai:
                answer = oai.chat.completions.create(model=CODEX_MODEL, messages=OPENAI_HISTORY,
                                                     tools=WEATHER_OAI, timeout=60)
            assert answer.choices[0].message.content == "tool said: Snow -3C"
            assert _codex_tail(upstream) == [
                {"type": "function_call", "name": "get_weather",
                 "arguments": '{"city": "Oslo"}', "call_id": "call_1"},
                {"type": "function_call_output", "call_id": "call_1", "output": "Snow -3C"}]
            with anthropic_client(srv) as ant:
                answer = ant.messages.create(model=CODEX_MODEL, max_tokens=256, timeout=60,
                                             tools=WEATHER_ANT, messages=ANTHROPIC_HISTORY)
            assert answer.content[-1].text == "tool said: Rain 12C"
            assert _codex_tail(upstream) == [
                {"type": "function_call", "name": "get_weather",
                 "arguments": '{"city":"Rome"}', "call_id": "toolu_1"},
                {"type": "function_call_output", "call_id": "toolu_1", "output": "Rain 12C"}]
            assert wait_for(lambda: _stats(http, "codex-a").get("rebuilds") == 2)


# --- Gemini CLI -------------------------------------------------------------------------------

GEMINI_MODEL = "gemini-2.5-pro"
FAKE_GEMINI = Path(__file__).resolve().parents[1] / "fakes" / "fake_gemini.py"


def _gemini(kind: str, tmp_path: Path, upstream: GeminiCliUpstream) -> WorkerSettings:
    command = (sys.executable, str(FAKE_GEMINI)) if kind == "fake" else (
        _npm_cli(GEMINI_CLI, prefix=GEMINI_PREFIX),)
    return WorkerSettings(name="gemini-a", kind="cli", cli="gemini", models=(GEMINI_MODEL,),
                          home=str(tmp_path / "acct"), command=command, ready_timeout=60,
                          env=_env(GOOGLE_GEMINI_BASE_URL=upstream.url, GEMINI_API_KEY=KEY,
                                   FAKE_GEMINI_LOG=str(tmp_path / "gemini.log")))


@pytest.mark.parametrize("kind", ["fake", CLI])
def test_gemini_a_rebuilt_tool_turn_gets_the_clients_result_in_its_prompt(tmp_path, kind):
    with GeminiCliUpstream(api_key=KEY) as upstream:
        with serve(_gemini(kind, tmp_path, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            _ready(http, "gemini-a")
            with openai_client(srv) as oai:
                answer = oai.chat.completions.create(model=GEMINI_MODEL, messages=OPENAI_HISTORY,
                                                     tools=WEATHER_OAI, timeout=90)
            with anthropic_client(srv) as ant:
                again = ant.messages.create(model=GEMINI_MODEL, max_tokens=256, timeout=90,
                                            tools=WEATHER_ANT, messages=ANTHROPIC_HISTORY)
    prompts = ["".join(p.get("text", "") for p in g.body["contents"][-1]["parts"])
               for g in upstream.generations()]
    for prompt, reply, said in ((prompts[0], answer.choices[0].message.content, "Snow -3C"),
                                (prompts[1], again.content[-1].text, "Rain 12C")):
        call = "call_1" if said == "Snow -3C" else "toolu_1"
        assert f"(called tool get_weather with " in prompt
        assert f"(result of tool call {call}: {said})" in prompt
        assert reply.startswith("echo: ") and said in reply

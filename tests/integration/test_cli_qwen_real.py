"""The real Qwen Code 0.15.10 (npm, in .cache/npm) behind a real poolgate,
against a fake OpenAI upstream, driven by the real SDKs: as a ``qwen`` cli
worker, and as an ACP agent (``qwen --acp``) under the generic ``jsonrpc``
driver with its defaults."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest

from app.settings import WorkerSettings
from tests.fakes.upstreams import FakeUpstream
from tests.integration.clis import PINNED_VERSIONS, QWEN_CODE, ensure_cli
from tests.support.cli_accounts import wait_for
from tests.support.cli_fakes import ADMIN, anthropic_client, openai_client, serve, worker_info

pytestmark = [pytest.mark.cli, pytest.mark.slow]

KEY = "sk-qwen-real-account"
MODEL = "qwen3-coder-plus"


@pytest.fixture(scope="module")
def qwen_bin() -> str:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install Qwen Code")
    path = ensure_cli(*QWEN_CODE)
    assert path is not None
    return path


def _worker(home: Path, qwen_bin: str, upstream: FakeUpstream, **extra) -> WorkerSettings:
    return WorkerSettings(
        name="qwen-real", kind="cli", cli="qwen", models=(MODEL,), home=str(home),
        command=(qwen_bin,), ready_timeout=60, health_interval=2.0, health_timeout=5.0,
        env={"OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": KEY,
             "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **extra)


def _ready(http: httpx.Client) -> dict:
    return wait_for(lambda: (w := worker_info(http)["qwen-real"])["state"] == "ready" and w,
                    timeout=60)


def _hits(http: httpx.Client) -> int:
    """Session reuse hits (the status is polled from the worker child after each answer)."""
    stats = http.get("/internal/stats", headers=ADMIN).json()["cli_sessions"]
    return stats["workers"].get("qwen-real", {}).get("hits", 0)


def _cli_pids(gateway_pid_of_worker: int) -> list[int]:
    """The processes the worker child started (its qwen conversations)."""
    found = []
    for task in Path(f"/proc/{gateway_pid_of_worker}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def test_real_qwen_turns_through_poolgate(tmp_path: Path, qwen_bin: str):
    with FakeUpstream(api_key=KEY, models=(MODEL,)) as upstream:
        with serve(_worker(tmp_path / "acct", qwen_bin, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            info = _ready(http)
            assert (info["cli"], info["version"], info["login"]) == ("qwen", PINNED_VERSIONS["@qwen-code/qwen-code"], "ready")
            history = [{"role": "system", "content": "Answer briefly."},
                       {"role": "user", "content": "hello real qwen"}]
            with openai_client(srv) as oai:
                # the same max_tokens as the Anthropic turn below: a change of it opens a
                # new conversation (the host keys warm conversations by their switches)
                out = oai.chat.completions.create(model=MODEL, messages=history, timeout=60,
                                                  max_tokens=64)
            assert out.choices[0].message.content == "echo: hello real qwen"
            assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 4
            history.append({"role": "assistant", "content": out.choices[0].message.content})
            with anthropic_client(srv) as ant, ant.messages.stream(
                    model=MODEL, max_tokens=64, system="Answer briefly.",
                    messages=[{"role": m["role"], "content": m["content"]} for m in history[1:]]
                    + [{"role": "user", "content": "streamed second turn"}]) as stream:
                chunks = list(stream.text_stream)
                final = stream.get_final_message()
            assert "".join(chunks) == "echo: streamed second turn" and len(chunks) > 1
            assert final.stop_reason == "end_turn" and final.usage.output_tokens == 4
            wait_for(lambda: _hits(http) == 1)  # the second turn went on warm
        posts = [r.body for r in upstream.requests if r.body is not None]
        # one upstream call per turn (managed auto-memory off), one growing conversation,
        # chat mode: no tools, the client's system prompt first
        assert len(posts) == 2
        assert not posts[0].get("tools")  # Qwen sends "tools": [] when every tool is excluded
        assert posts[0]["messages"][0]["content"].startswith("Answer briefly.")
        texts = [json.dumps(m["content"]) for m in posts[1]["messages"]]
        assert "hello real qwen" in texts[-3] and "streamed second turn" in texts[-1]


def test_real_qwen_disconnect_ends_the_process_and_the_next_turn_resumes(tmp_path: Path,
                                                                          qwen_bin: str):
    with FakeUpstream(api_key=KEY, models=(MODEL,)) as upstream:
        with serve(_worker(tmp_path / "acct", qwen_bin, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            child = _ready(http)["pid"]
            body = {"model": MODEL, "stream": True, "messages": [
                {"role": "user", "content": "[[hang-after:2]] one two three four"}]}
            with http.stream("POST", "/v1/chat/completions", json=body,
                             headers={"authorization": "Bearer sk-team-a"}) as r:
                for line in r.iter_lines():
                    if '"content"' in line:
                        break  # the first text arrived: the client leaves
            assert wait_for(lambda: upstream.disconnects >= 1, timeout=15)
            wait_for(lambda: not _cli_pids(child), timeout=15)  # the qwen process ended
            with openai_client(srv) as oai:
                out = oai.chat.completions.create(model=MODEL, timeout=60, messages=[
                    {"role": "user", "content": "earlier"},
                    {"role": "assistant", "content": "echo: earlier"},
                    {"role": "user", "content": "back again"}])
            assert out.choices[0].message.content == "echo: back again"
            # resumed from a transcript, not flattened into one prompt
            last = [r.body for r in upstream.requests if r.body is not None][-1]["messages"]
            assert [m["role"] for m in last[-3:]] == ["user", "assistant", "user"]
            assert "earlier" in json.dumps(last[-3]["content"])


def test_real_qwen_agent_mode_runs_its_own_tools(tmp_path: Path, qwen_bin: str):
    home = tmp_path / "acct"
    (home / "workspace").mkdir(parents=True)
    notes = home / "workspace" / "notes.txt"
    notes.write_text("the secret is 42\n")
    with FakeUpstream(api_key=KEY, models=(MODEL,)) as upstream:
        with serve(_worker(home, qwen_bin, upstream, mode="agent")) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            _ready(http)
            with openai_client(srv) as oai:
                out = oai.chat.completions.create(model=MODEL, timeout=60, messages=[
                    {"role": "user", "content":
                     f'[[tool:read_file {{"file_path": "{notes}"}}]] read my notes'}])
        text = out.choices[0].message.content
        # the tool ran inside the CLI: shown to the client, nothing for it to answer
        assert "read_file" in text and "the secret is 42" in text
        assert text.endswith("tool said: the secret is 42")
        assert out.choices[0].finish_reason == "stop"
        first = [r.body for r in upstream.requests if r.body is not None][0]
        assert "read_file" in [t["function"]["name"] for t in first["tools"]]


def test_real_qwen_client_tool_round_trip(tmp_path: Path, qwen_bin: str):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    with FakeUpstream(api_key=KEY, models=(MODEL,)) as upstream:
        with serve(_worker(tmp_path / "acct", qwen_bin, upstream)) as srv, \
                httpx.Client(base_url=srv.url, timeout=60) as http:
            _ready(http)
            messages = [{"role": "user", "content":
                         '[[tool:mcp__gw__get_weather {"city": "Paris"}]] weather please'}]
            with openai_client(srv) as oai:
                first = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                                    timeout=60)
                assert first.choices[0].finish_reason == "tool_calls"
                [call] = first.choices[0].message.tool_calls
                assert (call.function.name, json.loads(call.function.arguments)) == (
                    "get_weather", {"city": "Paris"})
                messages += [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": "Sunny 21C"}]
                second = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                                     timeout=60)
            assert second.choices[0].message.content == "tool said: Sunny 21C"
            wait_for(lambda: _hits(http) == 1)  # answered in the same process
        posts = [r.body for r in upstream.requests if r.body is not None]
        assert [t["function"]["name"] for t in posts[0]["tools"]] == ["mcp__gw__get_weather"]
        assert posts[1]["messages"][-1] == {"role": "tool", "tool_call_id": call.id,
                                            "content": [{"type": "text", "text": "Sunny 21C"}]}


def test_qwen_acp_through_the_jsonrpc_driver(tmp_path: Path, qwen_bin: str):
    # what an operator does for Qwen in ACP mode (the qwen driver does it itself):
    # managed auto-memory off, or every prompt costs a second upstream call (and from
    # 0.24 on, follow-up suggestions off: a third one)
    settings = tmp_path / "acct" / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"memory": {"enableManagedAutoMemory": False},
                                    "ui": {"enableFollowupSuggestions": False}}))
    with FakeUpstream(api_key=KEY, models=(MODEL,)) as upstream:
        worker = WorkerSettings(
            name="acp-a", kind="cli", cli="jsonrpc", models=(MODEL,), home=str(tmp_path / "acct"),
            command=(qwen_bin, "--acp", "--auth-type", "openai", "--model", MODEL),
            ready_timeout=60, health_interval=2.0, health_timeout=5.0,
            env={"OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": KEY,
                 "QWEN_CODE_NO_RELAUNCH": "true", "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            info = wait_for(lambda: (w := worker_info(http)["acp-a"])["state"] == "ready" and w,
                            timeout=60)
            assert (info["cli"], info["version"], info["login"]) == (
                "jsonrpc", PINNED_VERSIONS["@qwen-code/qwen-code"], "ready")
            history = [{"role": "user", "content": "hello acp"}]
            with openai_client(srv) as oai:
                out = oai.chat.completions.create(model=MODEL, messages=history, timeout=60,
                                                  max_tokens=64)
            assert out.choices[0].message.content == "echo: hello acp"
            # Qwen reports usage in a session/update's _meta, not in the prompt's result
            assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens == 3
            history.append({"role": "assistant", "content": out.choices[0].message.content})
            with anthropic_client(srv) as ant, ant.messages.stream(
                    model=MODEL, max_tokens=64,
                    messages=history + [{"role": "user", "content": "streamed second turn"}]) \
                    as stream:
                chunks = list(stream.text_stream)
                final = stream.get_final_message()
            assert "".join(chunks) == "echo: streamed second turn" and len(chunks) > 1
            assert final.stop_reason == "end_turn"

            def hits() -> int:
                stats = http.get("/internal/stats", headers=ADMIN).json()["cli_sessions"]
                return stats["workers"].get("acp-a", {}).get("hits", 0)

            wait_for(lambda: hits() == 1)  # the second turn went to the same ACP session
        posts = [r.body for r in upstream.requests if r.body is not None]
        assert len(posts) == 2  # one upstream call per turn: one conversation, growing
        texts = [json.dumps(m["content"]) for m in posts[1]["messages"]]
        assert "hello acp" in texts[-3] and "streamed second turn" in texts[-1]

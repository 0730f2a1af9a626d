"""No client text on a CLI's command line, and nothing a CLI prints in a
client's error (issue 20, sections 2 and 3): the fake ``qwen`` and ``claude``
CLIs (parsing their options as yargs and commander do) in real worker
children behind a real poolgate."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import openai
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, spawns, wait_for
from tests.support.cli_fakes import (anthropic_client, fake_cli_worker, openai_client, processes,
                                     serve, worker_info)

pytestmark = pytest.mark.slow

QWEN_KEY = "sk-qwen-account-a"
QWEN_MODEL = "qwen-coder"
CLAUDE_TOKEN = "sk-ant-oat01-team-account"
CLAUDE_MODEL = "claude-sonnet-4-6"
BIG = "A system prompt of one mebibyte. " * (1024 * 1024 // 32)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").partition("=")[::2] for e in raw if e)


@pytest.fixture
def qwen(tmp_path: Path):
    with FakeUpstream(api_key=QWEN_KEY, models=(QWEN_MODEL,)) as upstream, \
            FakeUpstream(models=(QWEN_MODEL,)) as elsewhere:
        log = tmp_path / "qwen.log"
        worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log,
                                 api_key=QWEN_KEY, max_conversations=8)
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["qwen-a"]["state"] == "ready")
            yield srv, upstream, elsewhere, log, tmp_path / "a"


def _system_sent(upstream: FakeUpstream, user_text: str) -> str:
    """The system prompt of the upstream request that carried ``user_text``."""
    for received in upstream.requests:
        body = received.body or {}
        if any(user_text in json.dumps(m.get("content")) for m in body.get("messages", [])
               if m.get("role") == "user"):
            system = body["messages"][0] if "system" not in body else body["system"][0]
            return system["content"] if "content" in system else system["text"]
    raise AssertionError(f"no upstream request carried {user_text!r}")


@pytest.mark.parametrize("system", ["--openai-base-url={elsewhere}", "- a list item first",
                                    "--- a rule first", BIG], ids=["option", "dash", "rule", "1MiB"])
def test_qwen_gets_the_system_prompt_as_text_never_as_arguments(qwen, system):
    srv, upstream, elsewhere, log, home = qwen
    system = system.format(elsewhere=elsewhere.url)
    with openai_client(srv) as oai:
        out = oai.chat.completions.create(model=QWEN_MODEL, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": "who are you"}])
    assert out.choices[0].message.content == "echo: who are you"
    # the configured upstream got the request (with the account's key), the prompt as text
    assert _system_sent(upstream, "who are you") == system
    assert elsewhere.requests == []
    [proc] = processes(log)
    pid = proc["pid"]
    cmdline = _cmdline(pid)
    assert system[:40] not in cmdline and "--openai-base-url" not in cmdline
    # the prompt is a 0600 file in a 0700 directory, named in the CLI's environment
    path = Path(_environ(pid)["QWEN_SYSTEM_MD"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == system


def test_the_qwen_prompt_file_is_removed_with_its_conversation(tmp_path: Path):
    with FakeUpstream(api_key=QWEN_KEY, models=(QWEN_MODEL,)) as upstream:
        log = tmp_path / "qwen.log"
        worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log,
                                 api_key=QWEN_KEY, max_conversations=1)
        with serve(worker) as srv, openai_client(srv) as oai:
            for word in ("first", "second"):  # the second evicts the first conversation
                oai.chat.completions.create(model=QWEN_MODEL, messages=[
                    {"role": "system", "content": f"prompt {word}"},
                    {"role": "user", "content": word}])
            first, second = processes(log)
            wait_for(lambda: not Path(f"/proc/{first['pid']}").exists()
                     or Path(f"/proc/{first['pid']}/stat").read_text().split()[2] == "Z")
            files = sorted(p.read_text() for p in (tmp_path / "a").glob(".poolgate-prompt-*/*"))
            assert files == ["prompt second"]
        assert list((tmp_path / "a").glob(".poolgate-prompt-*")) == []  # the worker stopped


@pytest.fixture
def claude(tmp_path: Path):
    with FakeUpstream(api_key=CLAUDE_TOKEN, models=(CLAUDE_MODEL,)) as upstream:
        log = tmp_path / "claude.log"
        worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", CLAUDE_TOKEN),
                                    upstream.anthropic_url, log)
        with serve(worker) as srv:
            yield srv, upstream, log, tmp_path / "a"


@pytest.mark.parametrize("system", ["--settings={\"env\":{}}", "- a list item first",
                                    "--- a rule first", BIG], ids=["option", "dash", "rule", "1MiB"])
def test_claude_gets_the_system_prompt_as_text_never_as_arguments(claude, system):
    srv, upstream, log, home = claude
    with anthropic_client(srv) as ant:
        out = ant.messages.create(model=CLAUDE_MODEL, max_tokens=64, system=system,
                                  messages=[{"role": "user", "content": "who are you"}])
    assert out.content[0].text == "echo: who are you"
    assert _system_sent(upstream, "who are you") == system
    [proc] = spawns(log)
    assert system[:40] not in _cmdline(proc["pid"])
    assert not any(system[:40] in arg for arg in proc["argv"])
    # read at startup: the file is gone once the CLI is up
    assert list(home.glob(".poolgate-prompt-*")) == []


def test_what_a_failing_cli_prints_never_reaches_the_client_and_is_scrubbed_in_logs(
        tmp_path: Path, capfd):
    token = "plain-account-secret"  # no credential shape: only the account's file knows it
    with FakeUpstream(api_key=token, models=(CLAUDE_MODEL,)) as upstream:
        worker = fake_claude_worker("claude-a", claude_home(tmp_path / "a", token),
                                    upstream.anthropic_url, tmp_path / "claude.log",
                                    env={"FAKE_CLAUDE_FAULT": "leak-token"})
        with serve(worker) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            wait_for(lambda: worker_info(http)["claude-a"]["state"] == "ready")
            r = http.post("/v1/messages", headers={"authorization": "Bearer sk-team-a"}, json={
                "model": CLAUDE_MODEL, "max_tokens": 16,
                "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    request_id = r.headers["x-request-id"]
    assert message == f"worker claude-a: the claude CLI failed the turn (request {request_id})"
    assert token not in r.text and "Bearer" not in r.text
    out, err = capfd.readouterr()
    logs = out + err
    assert "cli.turn_failed" in logs and "claude exited with 1" in logs
    assert token not in logs and "[redacted]" in logs


def test_qwen_agent_mode_keeps_its_own_prompt_and_appends_the_clients(tmp_path: Path):
    with FakeUpstream(api_key=QWEN_KEY, models=(QWEN_MODEL,)) as upstream:
        log = tmp_path / "qwen.log"
        worker = fake_cli_worker("qwen", "qwen-a", tmp_path / "a", upstream.url, log,
                                 api_key=QWEN_KEY, mode="agent")
        with serve(worker) as srv, openai_client(srv) as oai:
            for word in ("one", "two"):  # two conversations: Qwen's prompt is asked for once
                oai.chat.completions.create(model=QWEN_MODEL, messages=[
                    {"role": "system", "content": f"--- agent rules {word}"},
                    {"role": "user", "content": word}])
            for word in ("one", "two"):
                assert _system_sent(upstream, word) == (
                    f"You are Qwen Code, an interactive CLI agent.\n\n---\n\n--- agent rules {word}")
            # the probe that wrote Qwen's prompt, then the two conversations
            assert len([p for p in processes(log) if "--approval-mode" not in p["argv"]]) == 1
            assert not any("agent rules" in _cmdline(p["pid"]) for p in processes(log)
                           if Path(f"/proc/{p['pid']}").exists())


def test_an_effort_that_is_not_one_short_line_is_a_400_naming_it(claude):
    srv, upstream, log, home = claude
    with openai_client(srv) as oai:
        with pytest.raises(openai.BadRequestError) as err:
            oai.chat.completions.create(model=CLAUDE_MODEL, reasoning_effort="high\n--tools=Bash",
                                        messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["param"] == "reasoning_effort"
    assert spawns(log) == [] and upstream.requests == []

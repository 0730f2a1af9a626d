"""The Vercel AI SDK (``ai`` 6 with ``@ai-sdk/openai`` 3), real, through
poolgate: its default Responses multi-turn flow sends earlier assistant
output back as ``item_reference`` items, which poolgate resolves from the
stored responses, over an OpenAI and an Anthropic upstream.

The packages are installed from npm into ``<repo>/.cache/npm-vercel`` (a
prefix of their own) on first use; without npm the test is skipped."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ANTHROPIC_MODEL, CLIENT_KEY

pytestmark = [pytest.mark.cli, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PREFIX = REPO / ".cache" / "npm-vercel"
PACKAGES = {"ai": "6.0.325", "@ai-sdk/openai": "3.0.141"}
SCRIPT = Path(__file__).parent / "vercel" / "multi_turn.cjs"


def _installed(name: str) -> str | None:
    try:
        return json.loads((PREFIX / "node_modules" / name / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="module")
def node_modules() -> Path:
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("npm and node are not installed: cannot install the Vercel AI SDK")
    PREFIX.mkdir(parents=True, exist_ok=True)
    with open(PREFIX / ".install.lock", "w") as lock:  # one installer at a time (xdist)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if any(_installed(name) != version for name, version in PACKAGES.items()):
            proc = subprocess.run(
                [npm, "install", "--prefix", str(PREFIX), "--save-exact", "--no-audit",
                 "--no-fund", "--loglevel=error",
                 *(f"{name}@{version}" for name, version in PACKAGES.items())],
                capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                check=False)
            assert proc.returncode == 0, proc.stderr[-2000:]
    return PREFIX / "node_modules"


def run_flow(gateway, model: str, node_modules: Path, home: Path, **extra: str) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "NODE_PATH": str(node_modules), "BASE_URL": gateway.openai_base,
           "API_KEY": CLIENT_KEY, "MODEL": model, "NO_PROXY": "127.0.0.1", **extra}
    proc = subprocess.run([shutil.which("node"), str(SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["texts"] == ["echo: first question", "echo: second question",
                            "echo: third question"]
    out["bodies"] = [json.loads(b) if isinstance(b, str) else b for b in out["bodies"]]
    return out


def references(body: dict) -> list[str]:
    return [item["id"] for item in body["input"] if item.get("type") == "item_reference"]


def test_default_multi_turn_flow(gateway, upstream_model, node_modules, tmp_path):
    out = run_flow(gateway, upstream_model, node_modules, tmp_path)
    # the SDK did send references (its default), one per earlier answer
    refs = [references(body) for body in out["bodies"]]
    assert [len(r) for r in refs] == [0, 1, 2]
    # and the upstream saw the whole conversation, the referenced answers in place
    sent = json.dumps(gateway.fake.last.body)
    assert "item_reference" not in sent
    order = ["first question", "echo: first question", "second question",
             "echo: second question", "third question"]
    assert [sent.index(text) for text in order] == sorted(sent.index(text) for text in order)


def test_reasoning_multi_turn_over_anthropic(gateway, node_modules, tmp_path):
    """Medium effort to an Anthropic upstream: each turn thinks, and the SDK
    refers back to the reasoning items as well; they reach the upstream as the
    signed thinking blocks they were (this fake refuses any other)."""
    gateway.fake.check_thinking = True
    try:
        out = run_flow(gateway, ANTHROPIC_MODEL, node_modules, tmp_path, REASONING="1",
                       PREFIX="[[think]] ")
    finally:
        gateway.fake.check_thinking = False
    assert out["reasoning"] == ["Thinking about: first question",
                                "Thinking about: second question",
                                "Thinking about: third question"]
    assert out["bodies"][0]["reasoning"] == {"effort": "medium", "summary": "auto"}
    refs = [references(body) for body in out["bodies"]]
    assert [sorted(r[:2] for r in ids) for ids in refs] == [[], ["ms", "rs"],
                                                            ["ms", "ms", "rs", "rs"]]
    sent = gateway.fake.last.body
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    thoughts = [block for message in sent["messages"] if message["role"] == "assistant"
                for block in message["content"] if block["type"] == "thinking"]
    assert [t["thinking"] for t in thoughts] == ["Thinking about: first question",
                                                 "Thinking about: second question"]

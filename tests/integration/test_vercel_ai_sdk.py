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

from .conftest import CLIENT_KEY

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


def test_default_multi_turn_flow(gateway, upstream_model, node_modules, tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "NODE_PATH": str(node_modules), "BASE_URL": gateway.openai_base,
           "API_KEY": CLIENT_KEY, "MODEL": upstream_model, "NO_PROXY": "127.0.0.1"}
    proc = subprocess.run([shutil.which("node"), str(SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["texts"] == ["echo: first question", "echo: second question",
                            "echo: third question"]
    # the SDK did send references (its default), one per earlier answer
    bodies = [json.loads(b) if isinstance(b, str) else b for b in out["bodies"]]
    kinds = [[item.get("type", "message") for item in body["input"]] for body in bodies[1:]]
    assert kinds[0].count("item_reference") == 1 and kinds[1].count("item_reference") == 2
    # and the upstream saw the whole conversation, the referenced answers in place
    sent = json.dumps(gateway.fake.last.body)
    assert "item_reference" not in sent
    order = ["first question", "echo: first question", "second question",
             "echo: second question", "third question"]
    assert [sent.index(text) for text in order] == sorted(sent.index(text) for text in order)

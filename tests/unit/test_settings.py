"""Settings: TOML file, POOLGATE_* env, CLI overrides, secret resolution, validation."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import orjson
import pytest
from pydantic import SecretStr, ValidationError

from app.settings import (
    ConfigError, ServerSettings, Settings, WorkerSettings, check_config, is_loopback_host, load_settings,
)

FULL = """
[server]
host = "127.0.0.1"
port = 8100
api_keys = { team-a = "sk-a", team-b = "sk-b" }
admin_token_env = "MY_ADMIN"
metrics_token_env = "MY_METRICS"
metrics_public = false
max_body_bytes = 1024
allow_insecure = false
log_level = "DEBUG"
log_format = "console"

[[workers]]
name = "gpt-upstream"
kind = "remote"
dialect = "openai"
url = "http://127.0.0.1:9000/v1/"
api_key_env = "UPSTREAM_KEY"
models = ["gpt-4o-mini"]
aliases = { "fast" = "gpt-4o-mini" }
connect_timeout = 5
first_byte_timeout = 60
idle_timeout = 30
max_connections = 8

[[workers]]
name = "claude"
dialect = "anthropic"
url = "https://api.example.com"
models = ["claude-x", "gpt-4o-mini"]
"""

WORKER = {"name": "w", "dialect": "openai", "url": "http://127.0.0.1:9000/v1", "models": ["m"]}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "poolgate.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_full_file_loads(tmp_path: Path) -> None:
    environ = {"UPSTREAM_KEY": "up-secret", "MY_ADMIN": "adm", "MY_METRICS": "met"}
    s = load_settings(write(tmp_path, FULL), environ)
    assert (s.server.host, s.server.port, s.server.max_body_bytes) == ("127.0.0.1", 8100, 1024)
    assert s.server.plain_api_keys() == {"team-a": "sk-a", "team-b": "sk-b"}
    assert (s.server.log_level, s.server.log_format) == ("debug", "console")
    assert s.server.admin_token.get_secret_value() == "adm"
    assert s.server.metrics_token.get_secret_value() == "met"
    gpt, claude = s.workers
    assert gpt.url == "http://127.0.0.1:9000/v1"  # trailing slash dropped
    assert gpt.api_key.get_secret_value() == "up-secret"
    assert (gpt.connect_timeout, gpt.first_byte_timeout, gpt.idle_timeout, gpt.max_connections) == (5, 60, 30, 8)
    assert gpt.resolve("fast") == "gpt-4o-mini" and gpt.resolve("claude-x") is None
    assert claude.api_key is None and claude.kind == "remote"
    assert s.model_names() == {"gpt-4o-mini", "fast", "claude-x"}


def test_defaults_without_file_or_env() -> None:
    s = load_settings(None, {})
    assert s.server == ServerSettings()
    assert (s.server.host, s.server.port, s.server.max_body_bytes) == ("127.0.0.1", 8000, 33554432)
    assert s.server.admin_token is None and s.server.metrics_token is None
    # nothing configured: the embedded default model on llama.cpp
    (default,) = s.workers
    assert (default.kind, default.engine, default.model, default.models) == (
        "local", "llamacpp", None, ("smollm2-135m-instruct",))
    assert load_settings(None, {}, {"server": {"demo": True}}).workers == ()


def test_local_worker_defaults_its_model_name() -> None:
    s = load_settings(None, {}, {"workers": [
        {"name": "a", "kind": "local", "engine": "transformers", "model": "/models/Qwen2.5-0.5B/"},
        {"name": "b", "kind": "local", "engine": "llamacpp", "model": "/m/tiny.Q4.gguf",
         "models": ["tiny"]}]})
    assert [w.models for w in s.workers] == [("Qwen2.5-0.5B",), ("tiny",)]


def test_secrets_never_in_repr(tmp_path: Path) -> None:
    environ = {"UPSTREAM_KEY": "up-secret", "MY_ADMIN": "adm-secret", "MY_METRICS": "met-secret"}
    s = load_settings(write(tmp_path, FULL), environ)
    for text in (repr(s), str(s), repr(s.workers[0]), s.model_dump_json()):
        for secret in ("sk-a", "sk-b", "up-secret", "adm-secret", "met-secret"):
            assert secret not in text


def test_direct_construction_ignores_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POOLGATE_SERVER__PORT", "9999")
    monkeypatch.setenv("POOLGATE_ADMIN_TOKEN", "from-env")
    s = Settings()
    assert s.server.port == 8000 and s.server.admin_token is None


def test_env_overrides_file(tmp_path: Path) -> None:
    environ = {
        "UPSTREAM_KEY": "x",
        "POOLGATE_SERVER__PORT": "9001",
        "POOLGATE_SERVER__METRICS_PUBLIC": "true",
        "POOLGATE_API_KEYS": "ci=sk-ci, ops=sk-ops",
    }
    s = load_settings(write(tmp_path, FULL), environ)
    assert s.server.port == 9001 and s.server.metrics_public is True
    assert s.server.host == "127.0.0.1" and s.server.max_body_bytes == 1024  # other file fields kept
    assert s.server.plain_api_keys() == {"ci": "sk-ci", "ops": "sk-ops"}  # replaced, not merged


def test_nested_env_json_and_case_insensitive_names() -> None:
    s = load_settings(None, {"POOLGATE_SERVER__API_KEYS": '{"x": "sk-x"}', "poolgate_server__log_level": "DEBUG"})
    assert s.server.plain_api_keys() == {"x": "sk-x"} and s.server.log_level == "debug"
    # POOLGATE_API_KEYS wins over the nested form.
    s = load_settings(None, {"POOLGATE_SERVER__API_KEYS": '{"x": "sk-x"}', "POOLGATE_API_KEYS": "y=sk-y"})
    assert s.server.plain_api_keys() == {"y": "sk-y"}


def test_config_path_from_env_and_workers_as_json(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 8200\n')
    environ = {"POOLGATE_CONFIG": path, "POOLGATE_WORKERS": orjson.dumps([WORKER]).decode(),
               "POOLGATE_API_KEYS": '{"a": "sk-1"}'}
    s = load_settings(None, environ)
    assert s.server.port == 8200
    assert [w.name for w in s.workers] == ["w"]
    assert s.server.plain_api_keys() == {"a": "sk-1"}


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 1111\nhost = "127.0.0.2"\nlog_level = "warning"\n')
    environ = {"POOLGATE_SERVER__PORT": "2222", "POOLGATE_SERVER__HOST": "127.0.0.3"}
    s = load_settings(path, environ, {"server": {"port": 3333}})
    assert (s.server.port, s.server.host, s.server.log_level) == (3333, "127.0.0.3", "warning")


def test_token_env_unset_or_empty_leaves_gate_closed(tmp_path: Path) -> None:
    s = load_settings(None, {"POOLGATE_ADMIN_TOKEN": "", "POOLGATE_METRICS_TOKEN": "m"})
    assert s.server.admin_token is None
    assert s.server.metrics_token.get_secret_value() == "m"


def test_missing_worker_secret_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, FULL), {})
    assert info.value.problems == ["workers[0].api_key_env: environment variable UPSTREAM_KEY is not set"]


def worker(**changes: object) -> dict:
    return {**WORKER, **changes}


INVALID = [
    ("port too high", {"server": {"port": 70000}}, "server.port: Input should be less than or equal to 65535"),
    ("negative port", {"server": {"port": -1}}, "server.port: Input should be greater than or equal to 0"),
    ("unknown server key", {"server": {"hots": "x"}}, "server.hots: unknown key"),
    ("unknown section", {"pool": {}}, "pool: unknown key"),
    ("unknown worker key", {"workers": [worker(modles=["m"])]}, "workers[0].modles: unknown key"),
    ("bad log level", {"server": {"log_level": "loud"}}, "server.log_level: Input should be"),
    ("bad body limit", {"server": {"max_body_bytes": 0}}, "server.max_body_bytes: Input should be greater than 0"),
    ("empty api key", {"server": {"api_keys": {"a": ""}}}, "server.api_keys: api key 'a' is empty"),
    ("shared api key", {"server": {"api_keys": {"a": "s", "b": "s"}}},
     "server.api_keys: api keys 'a' and 'b' have the same secret"),
    ("bad key name", {"server": {"api_keys": {"a b": "s"}}}, "server.api_keys: api key name 'a b' must be"),
    ("bad replica id", {"server": {"replica_id": "a:b"}}, "server.replica_id: String should match"),
    ("local without engine", {"workers": [{"name": "l", "kind": "local"}]},
     "workers[0]: a local worker needs an engine"),
    ("local without model", {"workers": [{"name": "l", "kind": "local", "engine": "vllm"}]},
     "workers[0]: a local vllm worker needs a model"),
    ("unknown engine", {"workers": [{"name": "l", "kind": "local", "engine": "onnx"}]},
     "workers[0].engine: Input should be 'llamacpp'"),
    ("cli without cli and home", {"workers": [{"name": "c", "kind": "cli", "models": ["m"]}]},
     "workers[0]: a cli worker needs cli and home"),
    ("unknown cli", {"workers": [{"name": "c", "kind": "cli", "cli": "cursor", "home": "/h",
                                  "models": ["m"]}]},
     "workers[0].cli: Input should be 'claude', 'codex', 'qwen', 'gemini' or 'jsonrpc'"),
    ("bad cli mode", {"workers": [{"name": "c", "kind": "cli", "cli": "claude", "home": "/h",
                                   "models": ["m"], "mode": "auto"}]},
     "workers[0].mode: Input should be 'chat' or 'agent'"),
    ("zero conversations", {"workers": [{"name": "c", "kind": "cli", "cli": "claude", "home": "/h",
                                         "models": ["m"], "max_conversations": 0}]},
     "workers[0].max_conversations: Input should be greater than 0"),
    ("unknown kind", {"workers": [worker(kind="magic")]}, "workers[0].kind: Input should be 'remote'"),
    ("bad dialect", {"workers": [worker(dialect="cobol")]},
     "workers[0].dialect: Input should be 'openai', 'anthropic' or 'gemini'"),
    ("ftp url", {"workers": [worker(url="ftp://host/")]}, "workers[0].url: url 'ftp://host/' must be an http"),
    ("url without host", {"workers": [worker(url="http://")]}, "workers[0].url: url 'http://' must be an http"),
    ("no models", {"workers": [worker(models=[])]}, "workers[0]: a worker needs at least one model"),
    ("models missing", {"workers": [{k: v for k, v in WORKER.items() if k != "models"}]},
     "workers[0]: a worker needs at least one model"),
    ("duplicate model", {"workers": [worker(models=["m", "m"])]}, "workers[0].models: model names must be unique"),
    ("dangling alias", {"workers": [worker(aliases={"fast": "other"})]},
     "workers[0]: alias 'fast' points at 'other', which this worker does not serve"),
    ("alias shadows model", {"workers": [worker(models=["m", "n"], aliases={"m": "n"})]},
     "workers[0]: alias 'm' shadows a model"),
    ("zero timeout", {"workers": [worker(idle_timeout=0)]}, "workers[0].idle_timeout: Input should be greater than 0"),
    ("negative connections", {"workers": [worker(max_connections=-1)]},
     "workers[0].max_connections: Input should be greater than or equal to 0"),
    ("bad worker name", {"workers": [worker(name="a/b")]}, "workers[0].name: worker name 'a/b' must be"),
    ("duplicate worker name", {"workers": [worker(), worker(models=["x"])]},
     "workers: workers[1].name 'w' is already used by workers[0]"),
    ("alias means another model elsewhere", {"workers": [
        worker(name="a", models=["m", "n"], aliases={"fast": "m"}),
        worker(name="b", models=["n"], aliases={"fast": "n"})]},
     "workers: workers[1] serves 'fast' as 'n' but workers[0] serves it as 'm'"),
    ("alias is a model elsewhere", {"workers": [
        worker(name="a", models=["m"]), worker(name="b", models=["n"], aliases={"m": "n"})]},
     "workers: workers[1] serves 'm' as 'n' but workers[0] serves it as 'm'"),
]


@pytest.mark.parametrize(("case", "overrides", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_each_validation_error(case: str, overrides: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, {}, overrides)
    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith(expected), info.value.problems[0]


def test_same_model_on_several_workers_is_a_pool() -> None:
    s = load_settings(None, {}, {"workers": [
        worker(name="a", models=["m"], aliases={"fast": "m"}),
        worker(name="b", dialect="anthropic", models=["m"], aliases={"fast": "m"})]})
    assert [w.name for w in s.workers] == ["a", "b"]


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ValidationError):
        Settings(workers=[WorkerSettings(**WORKER), WorkerSettings(**WORKER)])
    s = Settings(server=ServerSettings(api_keys={"a": SecretStr("k")}), workers=[WORKER])
    assert s.server.plain_api_keys() == {"a": "k"} and s.workers[0].name == "w"


BAD_ENV = [
    ("bad workers json", {"POOLGATE_WORKERS": "[{"}, 'environment: error parsing value for field "workers"'),
    ("bad api keys json", {"POOLGATE_API_KEYS": "{nope"}, "POOLGATE_API_KEYS: not valid JSON"),
    ("api keys not strings", {"POOLGATE_API_KEYS": '{"a": 1}'}, "POOLGATE_API_KEYS: every key must be a string"),
    ("api keys entry without =", {"POOLGATE_API_KEYS": "a=1,sk-leaked"},
     "POOLGATE_API_KEYS: entry 2 is not of the form name=key"),
    ("bad port", {"POOLGATE_SERVER__PORT": "eighty"}, "server.port: Input should be a valid integer"),
]


@pytest.mark.parametrize(("case", "environ", "expected"), BAD_ENV, ids=[c[0] for c in BAD_ENV])
def test_bad_environment(case: str, environ: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ)
    assert info.value.problems[0].startswith(expected), info.value.problems
    assert "sk-leaked" not in str(info.value)


def test_check_config_lists_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [server]
        port = 99999
        colour = "blue"

        [[workers]]
        name = "a"
        dialect = "openai"
        url = "http://127.0.0.1:1"
        api_key_env = "NOT_SET_ANYWHERE"
        models = ["m"]

        [[workers]]
        name = "b"
        kind = "remote"
        dialect = "openai"
        url = "file:///tmp"
        models = ["m"]

        [[workers]]
        name = "c"
        kind = "cli"
        cli = "claude"
        home = "/h"
        models = ["c"]
        env = { ANTHROPIC_API_KEY_env = "NOT_SET_EITHER" }
    """)
    assert check_config(path, {}) == [
        "workers[0].api_key_env: environment variable NOT_SET_ANYWHERE is not set",
        "workers[2].env.ANTHROPIC_API_KEY_env: environment variable NOT_SET_EITHER is not set",
        "server.port: Input should be less than or equal to 65535",
        "server.colour: unknown key",
        "workers[1].url: url 'file:///tmp' must be an http:// or https:// URL with a host",
    ]


def test_check_config_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nhost = "127.0.0.1"\nport = \n')
    [problem] = check_config(path, {})
    assert problem.startswith(f"{path}: TOML syntax error") and "line 3" in problem


def test_check_config_missing_file_and_fine_file(tmp_path: Path) -> None:
    assert check_config(str(tmp_path / "absent.toml"), {}) == [f"{tmp_path / 'absent.toml'}: config file not found"]
    assert check_config(write(tmp_path, FULL), {"UPSTREAM_KEY": "k"}) == []


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("example.com", False),
])
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
    assert ServerSettings(host=host).needs_insecure_opt_in is (not loopback)
    assert ServerSettings(host=host, api_keys={"a": SecretStr("k")}).needs_insecure_opt_in is False


def test_responses_table_merges_file_and_env(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "[responses]\nmax_items = 5\n"),
                      {"POOLGATE_RESPONSES__MAX_BYTES": "1000"})
    assert (s.responses.max_items, s.responses.max_bytes) == (5, 1000)
    assert s.responses.max_age_seconds == 30 * 24 * 3600
    problems = check_config(write(tmp_path, "[responses]\nmax_items = 0\nbogus = 1\n"), {})
    assert any(p.startswith("responses.max_items") for p in problems)
    assert any("bogus" in p for p in problems)


@pytest.mark.parametrize(("worker", "expected"), [
    ({"name": "r", "models": ["m"], "dialect": "openai"}, "a remote worker needs url"),
    ({"name": "r", "models": ["m"], "url": "http://h/v1"}, "a remote worker needs dialect"),
    ({"name": "p", "kind": "process", "models": ["m"]}, "a process worker needs a command"),
])
def test_worker_kind_needs_its_fields(worker: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, {}, {"workers": [worker]})
    assert any(expected in p for p in err.value.problems)


def test_process_worker_loads() -> None:
    s = load_settings(None, {}, {"workers": [
        {"name": "p", "kind": "process", "models": ["m"], "command": ["python", "-m", "w"],
         "max_in_flight": 4, "env": {"A": "1"}}]})
    (w,) = s.workers
    assert w.command == ("python", "-m", "w") and w.max_in_flight == 4 and w.env == {"A": "1"}


def test_environment_is_kept_for_child_processes_not_configurable() -> None:
    s = load_settings(None, {"PATH": "/bin", "SECRET_THING": "x"})
    assert s.environment == {"PATH": "/bin", "SECRET_THING": "x"}
    assert "SECRET_THING" not in repr(s)
    assert Settings().environment == {}  # built directly: nothing read
    with pytest.raises(ConfigError):
        load_settings(None, {}, {"_environment": {"A": "1"}})


def test_cli_worker_settings_with_the_issue_names_and_secret_env(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[workers]]
        name = "claude-a"
        kind = "cli"
        cli = "claude"
        models = ["claude-sonnet-4-6"]
        aliases = { sonnet = "claude-sonnet-4-6" }
        home = "/var/lib/poolgate/accounts/claude-a"
        command = ["claude"]
        env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:9", ANTHROPIC_API_KEY_env = "TEAM_KEY" }
        mode = "agent"
        max_conversations = 2

        [workers.cli_options]
        start_session = "session/new"

        [cli_sessions]
        max_entries = 10
    """)
    settings = load_settings(path, {"TEAM_KEY": "sk-secret"})
    [w] = settings.workers
    assert (w.kind, w.cli, w.home, w.command, w.mode, w.max_conversations) == (
        "cli", "claude", "/var/lib/poolgate/accounts/claude-a", ("claude",), "agent", 2)
    assert w.env == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    assert w.env_secrets["ANTHROPIC_API_KEY"].get_secret_value() == "sk-secret"
    assert "sk-secret" not in repr(w)
    assert w.cli_options == {"start_session": "session/new"}
    assert settings.cli_sessions.max_entries == 10
    defaults = WorkerSettings(name="q", kind="cli", cli="qwen", home="/h", models=("q",))
    assert (defaults.mode, defaults.max_conversations, defaults.command) == ("chat", 4, ())


KEYS_TOML = """
[server]
api_keys = { plain = "sk-plain" }
[server.keys.team-a]
secret_env = "TEAM_A_KEY"
models = ["claude-*", "gpt-4o-mini"]
max_in_flight = 8
rpm = 600
tpm = 2000000
budget_tokens = { day = 5000000, month = 100000000 }
[server.keys.team-b]
secret_file = "SECRET_FILE"
"""


def test_key_policies_load_with_secrets_from_env_and_file(tmp_path: Path) -> None:
    secret = tmp_path / "team-b.key"
    secret.write_text("sk-from-file\n")
    path = tmp_path / "keys.toml"
    path.write_text(KEYS_TOML.replace("SECRET_FILE", str(secret)))
    s = load_settings(str(path), {"TEAM_A_KEY": "sk-a", "POOLGATE_STATE_DIR": str(tmp_path)})
    a, b = s.server.keys["team-a"], s.server.keys["team-b"]
    assert a.secret.get_secret_value() == "sk-a" and b.secret.get_secret_value() == "sk-from-file"
    assert a.models == ("claude-*", "gpt-4o-mini") and a.max_in_flight == 8
    assert (a.rpm, a.tpm, a.budget_tokens.day, a.budget_tokens.month) == (
        600, 2000000, 5000000, 100000000)
    assert b.rpm is None and b.budget_tokens is None
    assert s.server.state_dir == str(tmp_path)
    assert "sk-a" not in repr(s) and "sk-from-file" not in repr(s)


def test_key_policy_problems_are_named(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS_TOML.replace("SECRET_FILE", str(tmp_path / "missing")))
    with pytest.raises(ConfigError) as info:
        load_settings(str(path), {})
    text = str(info.value)
    assert "server.keys.team-a.secret_env: environment variable TEAM_A_KEY is not set" in text
    assert "server.keys.team-b.secret_file: cannot read" in text
    (tmp_path / "same").write_text("sk-plain")
    path.write_text(KEYS_TOML.replace("SECRET_FILE", str(tmp_path / "same")))
    with pytest.raises(ConfigError) as clash:
        load_settings(str(path), {"TEAM_A_KEY": "sk-a"})
    assert "same secret" in str(clash.value) and "sk-plain" not in str(clash.value)
    bad = tmp_path / "bad.toml"
    bad.write_text('[server.keys.x]\nsecret_env = "X"\nrpm = 0\n')
    with pytest.raises(ConfigError) as zero:
        load_settings(str(bad), {"X": "sk-x"})
    assert "server.keys.x.rpm" in str(zero.value)


def test_redis_url_from_the_file_or_poolgate_redis_url(tmp_path) -> None:
    assert load_settings(None, {}).server.redis_url is None
    path = tmp_path / "poolgate.toml"
    path.write_text('[server]\nredis_url = "redis://127.0.0.1:6379/0"\n')
    assert load_settings(str(path), {}).server.redis_url == "redis://127.0.0.1:6379/0"
    env = {"POOLGATE_REDIS_URL": "redis://redis:6379/1"}
    assert load_settings(str(path), env).server.redis_url == "redis://redis:6379/1"
    assert load_settings(None, env).server.redis_timeout == 0.1
    with pytest.raises(ConfigError, match="redis_url"):
        load_settings(None, {"POOLGATE_REDIS_URL": "http://redis:6379"})


def _cli(name: str, home: str) -> dict:
    return {"name": name, "kind": "cli", "cli": "claude", "models": ["m"], "home": home}


def test_two_cli_workers_may_not_share_a_home(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    cases = [
        (str(tmp_path / "a"), str(tmp_path / "a" / "."), "the same home"),
        (str(tmp_path / "real"), str(tmp_path / "link"), "the same home"),
        (str(tmp_path / "a"), str(tmp_path / "a" / "workspace" / "b"), "nested homes"),
    ]
    for first, second, how in cases:
        path = tmp_path / "c.toml"
        path.write_text(toml_workers([_cli("acct-one", first), _cli("acct-two", second)]))
        with pytest.raises(ConfigError) as info:
            load_settings(str(path), {})
        text = str(info.value)
        assert "'acct-one' and 'acct-two' share " + how in text, text
    path.write_text(toml_workers([_cli("acct-one", str(tmp_path / "a")),
                                  _cli("acct-two", str(tmp_path / "ab"))]))
    assert len(load_settings(str(path), {}).workers) == 2


def toml_workers(workers: list[dict]) -> str:
    lines = []
    for w in workers:
        lines.append("[[workers]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in w.items()]
    return "\n".join(lines) + "\n"


def test_two_key_names_may_not_share_a_secret_whichever_table(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text('[server.api_keys]\nplain = "sk-same"\n'
                    '[server.keys.team]\nsecret_env = "TEAM_KEY"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(str(path), {"TEAM_KEY": "sk-same"})
    assert "keys 'plain' and 'team' have the same secret" in str(info.value)
    assert "sk-same" not in str(info.value)


def test_replica_ids_are_distinct_by_default() -> None:
    from app.replicas import default_replica_id

    assert load_settings(None, {}, {"server": {"replica_id": "gw-1.east"}}).server.replica_id == \
        "gw-1.east"
    ids = {default_replica_id() for _ in range(3)}  # several replicas on one host too
    assert len(ids) == 3 and all(re.fullmatch(r"[A-Za-z0-9._-]{1,64}", i) for i in ids)


def test_the_http_server_is_uvicorn_unless_granian_is_asked_for() -> None:
    assert load_settings(None, {}).server.http == "uvicorn"
    assert load_settings(None, {"POOLGATE_SERVER__HTTP": "granian"}).server.http == "granian"
    with pytest.raises(ConfigError) as refused:
        load_settings(None, {}, {"server": {"http": "hypercorn"}})
    assert any(p.startswith("server.http:") for p in refused.value.problems), refused.value.problems

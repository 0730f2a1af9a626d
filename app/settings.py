"""The one settings object, and the only module that reads the environment.

Built once by ``load_settings`` (file < ``POOLGATE_*`` env < CLI overrides <
defaults underneath) and passed down explicitly. ``Settings(...)`` built
directly (tests) reads nothing but its arguments. Secrets are resolved from
the environment at load time into ``SecretStr`` fields so they never show up
in a repr, a log line or an error message.
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson
from pydantic import (
    Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from .account_settings import missing_account_secrets, resolve_account
from .alert_settings import AlertSettings, missing_alert_secrets, resolve_alert_secrets
from .key_settings import missing_key_secrets, resolve_key_secrets
from .server_settings import (
    CliSessionSettings, ResponsesSettings, RoutingSettings, ServerSettings, is_loopback_host,
)
from .worker_settings import (
    DEFAULT_LOCAL_MODEL, DEFAULT_WORKER, EMBEDDED_SAMPLING, SamplingDefaultsSettings, WorkerSettings,
    check_homes, check_proxy_url, default_model_name,
)

__all__ = [
    "CONFIG_ENV", "API_KEYS_ENV", "ConfigError", "ServerSettings", "WorkerSettings", "Settings",
    "CliSessionSettings", "ResponsesSettings", "RoutingSettings", "SamplingDefaultsSettings",
    "DEFAULT_LOCAL_MODEL", "DEFAULT_WORKER", "EMBEDDED_SAMPLING", "default_model_name",
    "load_settings", "check_config", "is_loopback_host", "registered_worker", "REGISTRABLE",
    "registration_of",
]

CONFIG_ENV = "POOLGATE_CONFIG"
API_KEYS_ENV = "POOLGATE_API_KEYS"
STATE_DIR_ENV = "POOLGATE_STATE_DIR"
REDIS_URL_ENV = "POOLGATE_REDIS_URL"
DATABASE_URL_ENV = "POOLGATE_DATABASE_URL"

_SECTIONS = ("server", "responses", "routing", "cli_sessions")  # tables whose keys merge field by field across layers


class ConfigError(Exception):
    """The configuration cannot be loaded; ``problems`` lists every reason, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Settings(BaseSettings):
    """Everything the gateway is configured with."""

    model_config = SettingsConfigDict(
        env_prefix="POOLGATE_", env_nested_delimiter="__", extra="forbid", frozen=True,
    )

    # The environment load_settings read: what process workers inherit. Not a
    # configuration key; empty when Settings is built directly.
    _environment: dict[str, str] = PrivateAttr(default_factory=dict)

    server: ServerSettings = Field(default_factory=ServerSettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    cli_sessions: CliSessionSettings = Field(default_factory=CliSessionSettings)
    workers: tuple[WorkerSettings, ...] = ()
    alerts: tuple[AlertSettings, ...] = ()  # [[alerts]]: signed webhooks (app/alerts.py)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only explicit arguments: the environment is read by load_settings, from the mapping it is given.
        return (init_settings,)

    @property
    def environment(self) -> dict[str, str]:
        """The environment poolgate was started with, for the workers it starts."""
        return dict(self._environment)

    @field_validator("workers")
    @classmethod
    def _check_pool(cls, workers: tuple[WorkerSettings, ...]) -> tuple[WorkerSettings, ...]:
        names: dict[str, int] = {}
        meaning: dict[str, tuple[str, int]] = {}  # served name -> (model it means, first worker index)
        for i, worker in enumerate(workers):
            if worker.name in names:
                raise ValueError(f"workers[{i}].name {worker.name!r} is already used by workers[{names[worker.name]}]")
            names[worker.name] = i
            served = [(m, m) for m in worker.models] + list(worker.aliases.items())
            for name, target in served:
                first = meaning.setdefault(name, (target, i))
                if first[0] != target:
                    raise ValueError(
                        f"workers[{i}] serves {name!r} as {target!r} but workers[{first[1]}] serves it as {first[0]!r}"
                    )
        check_homes(workers)
        return workers

    @model_validator(mode="after")
    def _check_default_model(self) -> Settings:
        default = self.routing.default_model
        if default is not None and self.workers and not any(
                default in w.models or default in w.aliases for w in self.workers):
            raise ValueError(f"routing.default_model {default!r} is not a model or alias any "
                             "worker serves")
        served = self.model_names()
        unknown = sorted(m for m in self.routing.quota_reserve if self.workers and m not in served)
        if unknown:
            raise ValueError(f"routing.quota_reserve names {', '.join(map(repr, unknown))}, "
                             "which no worker serves")
        return self

    def model_names(self) -> frozenset[str]:
        """Every model and alias some worker serves (the label set for metrics)."""
        return frozenset(n for w in self.workers for n in (*w.models, *w.aliases))


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' env source reading a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def load_settings(config_path: str | None, environ: Mapping[str, str], overrides: dict | None = None) -> Settings:
    """Build the settings: defaults < file < ``POOLGATE_*`` env < ``overrides``; raises ``ConfigError``."""
    problems: list[str] = []
    path = config_path or environ.get(CONFIG_ENV) or None
    data = _read_toml(path, problems) if path else {}
    data = _merge(data, _env_layer(environ, problems))
    data = _merge(data, overrides or {})
    problems.extend(_missing_worker_secrets(data, environ))
    problems.extend(missing_key_secrets(data.get("server"), environ))
    problems.extend(missing_alert_secrets(data.get("alerts"), environ))
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        problems.extend(_format_error(err) for err in exc.errors())
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    if not settings.workers and not settings.server.demo:
        # nothing configured: the embedded default model on the llama.cpp engine
        settings = settings.model_copy(update={"workers": (DEFAULT_WORKER,)})
    return _resolve_secrets(settings, environ)


# What ``POST /internal/workers`` may set: a remote worker's fields, its key by
# environment variable name (``api_key`` itself is refused: no secret in a body).
REGISTRABLE = frozenset({
    "name", "kind", "dialect", "url", "models", "aliases", "api_key_env", "connect_timeout",
    "first_byte_timeout", "idle_timeout", "max_connections", "max_in_flight", "pass_fields",
    "pass_betas", "server_tools", "image_urls", "image_max_bytes", "proxy", "proxy_env",
})


def registered_worker(data: Mapping[str, Any], environ: Mapping[str, str],
                      secret_envs: Collection[str] = ()) -> WorkerSettings:
    """A remote worker registered at run time, validated as a ``[[workers]]``
    entry is and its key resolved from ``environ``; ``ConfigError`` otherwise.

    Its ``api_key_env`` must be one of ``secret_envs`` (``server.runtime_secret_envs``):
    whoever registers a worker chooses where its key is sent, so only variables the
    operator set aside for that may be named, never the admin token or cloud credentials."""
    if "api_key" in data:
        raise ConfigError(["api_key: secrets never go in a request body; name the environment "
                           "variable that holds it in api_key_env"])
    unknown = sorted(k for k in data if k not in REGISTRABLE)
    if unknown:
        raise ConfigError([f"{k}: unknown key (a registered worker takes "
                           f"{', '.join(sorted(REGISTRABLE))})" for k in unknown])
    if data.get("kind", "remote") != "remote":
        raise ConfigError(["kind: only remote workers can be registered at run time"])
    try:
        worker = WorkerSettings.model_validate({**data, "kind": "remote"})
    except ValidationError as exc:
        raise ConfigError([_format_error(err) for err in exc.errors()]) from None
    if worker.proxy is not None and urlsplit(worker.proxy.get_secret_value()).password:
        raise ConfigError(["proxy: a proxy password never goes in a request body; put the URL "
                           "in an environment variable listed in server.runtime_secret_envs "
                           "and name it in proxy_env"])
    for field, env in (("api_key_env", worker.api_key_env), ("proxy_env", worker.proxy_env)):
        if env is not None and env not in secret_envs:
            raise ConfigError([f"{field}: {env} is not listed in server.runtime_secret_envs "
                               "(the variables a worker registered at run time may name)"])
        if env is not None and not environ.get(env):
            raise ConfigError([f"{field}: environment variable {env} is not set"])
    return _resolve_worker(worker, environ)


def registration_of(worker: WorkerSettings) -> dict[str, Any]:
    """What the registration store keeps of a worker registered at run time:
    its settings as sent (an environment variable's name, never its value)."""
    registration = worker.model_dump(mode="json", include=set(REGISTRABLE - {"kind", "proxy"}))
    if worker.proxy_env is None and worker.proxy is not None:
        registration["proxy"] = worker.proxy.get_secret_value()  # checked: no password in it
    return registration


def check_config(path: str, environ: Mapping[str, str]) -> list[str]:
    """Every problem with the configuration at ``path`` (as ``serve`` would load it), or []."""
    try:
        settings = load_settings(path, environ)
    except ConfigError as exc:
        return exc.problems
    return _sandbox_problems(settings)


def _sandbox_problems(settings: Settings) -> list[str]:
    """Agent-mode cli workers whose sandbox this machine cannot give (``serve``
    refuses them the same way)."""
    from pool.cli.sandbox import SandboxUnavailable  # lazily: check-config stays light

    from .factory import cli_spec
    problems = []
    for i, worker in enumerate(settings.workers):
        if worker.kind == "cli" and worker.mode == "agent":
            try:
                cli_spec(worker, settings.environment)
            except SandboxUnavailable as exc:
                problems.append(f"workers[{i}].sandbox: {exc}")
    return problems


def _read_toml(path: str, problems: list[str]) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        problems.append(f"{path}: config file not found")
    except OSError as exc:
        problems.append(f"{path}: cannot read config file ({exc.strerror})")
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{path}: TOML syntax error: {exc}")
    return {}


def _env_layer(environ: Mapping[str, str], problems: list[str]) -> dict:
    try:
        data = dict(_MappingEnvSource(Settings, environ)())
    except SettingsError as exc:
        # pydantic-settings names our private source class; keep only the field.
        problems.append(f"environment: {str(exc).split(' from source')[0]} (expected JSON)")
        data = {}
    raw_keys = environ.get(API_KEYS_ENV)
    if raw_keys:
        keys = _parse_api_keys(raw_keys, problems)
        if keys is not None:
            data["server"] = {**data.get("server", {}), "api_keys": keys}
    for env, field in ((STATE_DIR_ENV, "state_dir"), (REDIS_URL_ENV, "redis_url"),
                       (DATABASE_URL_ENV, "database_url")):
        value = environ.get(env)
        if value:
            data["server"] = {**data.get("server", {}), field: value}
    return data


def _parse_api_keys(raw: str, problems: list[str]) -> dict[str, str] | None:
    """``POOLGATE_API_KEYS``: a JSON object, or ``name=key,name2=key2``."""
    if raw.lstrip().startswith("{"):
        try:
            keys = orjson.loads(raw)
        except orjson.JSONDecodeError:
            problems.append(f"{API_KEYS_ENV}: not valid JSON")
            return None
        if not all(isinstance(v, str) for v in keys.values()):
            problems.append(f"{API_KEYS_ENV}: every key must be a string")
            return None
        return keys
    keys = {}
    for index, entry in enumerate(e.strip() for e in raw.split(",")):
        name, eq, secret = entry.partition("=")
        if not eq or not name.strip() or not secret.strip():
            # The entry itself may be a secret: name its position, never its text.
            problems.append(f"{API_KEYS_ENV}: entry {index + 1} is not of the form name=key")
            return None
        keys[name.strip()] = secret.strip()
    return keys


def _merge(base: dict, layer: dict) -> dict:
    """Layer over base: sections merge field by field, everything else is replaced."""
    merged = dict(base)
    for key, value in layer.items():
        if key in _SECTIONS and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _missing_worker_secrets(data: dict, environ: Mapping[str, str]) -> list[str]:
    workers = data.get("workers")
    if not isinstance(workers, list | tuple):
        return []
    problems = []
    for i, worker in enumerate(workers):
        env = worker.get("api_key_env") if isinstance(worker, dict) else None
        if isinstance(env, str) and not environ.get(env):
            problems.append(f"workers[{i}].api_key_env: environment variable {env} is not set")
        proxy_env = worker.get("proxy_env") if isinstance(worker, dict) else None
        if isinstance(proxy_env, str) and not environ.get(proxy_env):
            problems.append(f"workers[{i}].proxy_env: environment variable {proxy_env} is not set")
        problems += missing_account_secrets(i, worker, environ)
        extra = worker.get("env") if isinstance(worker, dict) else None
        for name, var in _secret_refs(extra):
            if not environ.get(var):
                problems.append(f"workers[{i}].env.{name}_env: environment variable {var} is not set")
    return problems


def _secret_refs(env: Any) -> list[tuple[str, str]]:
    """``NAME_env = "VAR"`` entries of a worker's ``env``: (NAME, VAR)."""
    if not isinstance(env, dict):
        return []
    return [(key[:-4], var) for key, var in env.items()
            if isinstance(key, str) and key.endswith("_env") and isinstance(var, str)]


def _resolve_worker(worker: WorkerSettings, environ: Mapping[str, str]) -> WorkerSettings:
    update: dict[str, Any] = {}
    if worker.api_key_env:
        update["api_key"] = SecretStr(environ[worker.api_key_env])
    if worker.proxy_env:
        update["proxy"] = _proxy_from(worker, environ[worker.proxy_env])
    refs = _secret_refs(worker.env)
    if refs:
        update["env"] = {k: v for k, v in worker.env.items() if not k.endswith("_env")}
        update["env_secrets"] = {name: SecretStr(environ[var]) for name, var in refs}
    update.update(resolve_account(worker, environ))
    return worker.model_copy(update=update) if update else worker


def _proxy_from(worker: WorkerSettings, url: str) -> SecretStr:
    """The proxy URL ``proxy_env`` named, checked as ``proxy`` is (never quoted)."""
    try:
        check_proxy_url(url, worker.kind)
    except ValueError as exc:
        raise ConfigError([f"worker {worker.name}: proxy_env {worker.proxy_env}: {exc}"]) from None
    return SecretStr(url)


def _resolve_secrets(settings: Settings, environ: Mapping[str, str]) -> Settings:
    server = settings.server
    update: dict[str, SecretStr] = {}
    for field, env in (("admin_token", server.admin_token_env), ("metrics_token", server.metrics_token_env)):
        value = environ.get(env) if env else None
        if value:
            update[field] = SecretStr(value)
    workers = tuple(_resolve_worker(w, environ) for w in settings.workers)
    if server.keys:
        update["keys"] = resolve_key_secrets(server.keys, environ)  # type: ignore[assignment]
    # model_validate, not model_copy: the secrets just read must be checked for clashes
    try:
        server = ServerSettings.model_validate({**server.model_dump(), **update})
    except ValidationError as exc:
        raise ConfigError([_format_error(err) for err in exc.errors()]) from None
    resolved = settings.model_copy(update={"server": server, "workers": workers,
                                           "alerts": resolve_alert_secrets(settings.alerts, environ)})
    resolved._environment = dict(environ)
    return resolved


def _format_error(err: Mapping[str, Any]) -> str:
    loc = ""
    for part in err["loc"]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "value_error":
        message = str(err["ctx"]["error"])
    else:
        message = err["msg"]
    return f"{loc}: {message}" if loc else message

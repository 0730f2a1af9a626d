"""The one settings object, and the only module that reads the environment.

Built once by ``load_settings`` (file < ``POOLGATE_*`` env < CLI overrides <
defaults underneath) and passed down explicitly. ``Settings(...)`` built
directly (tests) reads nothing but its arguments. Secrets are resolved from
the environment at load time into ``SecretStr`` fields so they never show up
in a repr, a log line or an error message.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Collection, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
from pydantic import (
    BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from auth.keys import ANONYMOUS

from .account_settings import missing_account_secrets, resolve_account
from .alert_settings import AlertSettings, missing_alert_secrets, resolve_alert_secrets
from .key_settings import KeySettings, missing_key_secrets, resolve_key_secrets
from .worker_settings import (
    DEFAULT_LOCAL_MODEL, DEFAULT_WORKER, EMBEDDED_SAMPLING, SamplingDefaultsSettings, WorkerSettings,
    check_homes, check_proxy_url, default_model_name,
)

__all__ = [
    "CONFIG_ENV", "API_KEYS_ENV", "ConfigError", "ServerSettings", "WorkerSettings", "Settings",
    "CliSessionSettings", "SamplingDefaultsSettings", "DEFAULT_LOCAL_MODEL", "DEFAULT_WORKER",
    "EMBEDDED_SAMPLING", "default_model_name",
    "load_settings", "check_config", "is_loopback_host", "registered_worker", "REGISTRABLE",
    "registration_of",
]

CONFIG_ENV = "POOLGATE_CONFIG"
API_KEYS_ENV = "POOLGATE_API_KEYS"
STATE_DIR_ENV = "POOLGATE_STATE_DIR"
REDIS_URL_ENV = "POOLGATE_REDIS_URL"
DATABASE_URL_ENV = "POOLGATE_DATABASE_URL"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECTIONS = ("server", "responses", "routing", "cli_sessions")  # tables whose keys merge field by field across layers

LogLevel = Literal["critical", "error", "warning", "info", "debug"]


class ConfigError(Exception):
    """The configuration cannot be loaded; ``problems`` lists every reason, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerSettings(BaseModel):
    """The ``[server]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(8000, ge=0, le=65535)  # 0: let the OS pick (tests)
    api_keys: dict[str, SecretStr] = Field(default_factory=dict)
    keys: dict[str, KeySettings] = Field(default_factory=dict)  # [server.keys.<name>]: key + policy
    state_dir: str | None = None  # the SQLite file (default database), the ledger's backlog
    # keys, their policies, the usage ledger: sqlite:///path or postgresql://… (shared by
    # replicas); None: the SQLite file in state_dir (memory without one). A secret: a URL
    # may carry a password
    database_url: SecretStr | None = None
    # shared state of replicas (bindings, stored responses, limits, drains, locks); None: memory
    redis_url: str | None = None
    redis_timeout: float = Field(0.1, gt=0, le=5.0)  # bound of every Redis call, seconds
    # this replica's name in what only it holds in Redis (its cli session index: cli
    # workers are its processes, their names repeat on every replica); None: the
    # host name and a random suffix, new at every start
    replica_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,64}$")

    # every Redis key of this deployment starts with "<redis_prefix>:" (deployments sharing
    # one Redis need different ones; the replicas of one deployment, the same)
    redis_prefix: str = Field("poolgate", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    # the only environment variables a worker registered at run time may name in api_key_env
    runtime_secret_envs: tuple[str, ...] = ()
    admin_token_env: str | None = "POOLGATE_ADMIN_TOKEN"
    admin_token: SecretStr | None = None  # resolved from admin_token_env
    metrics_token_env: str | None = "POOLGATE_METRICS_TOKEN"
    metrics_token: SecretStr | None = None  # resolved from metrics_token_env
    metrics_public: bool = False
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    allow_insecure: bool = False
    log_level: LogLevel = "info"
    log_format: Literal["json", "console"] = "json"
    shutdown_timeout: float = Field(30.0, gt=0)
    # the HTTP server: uvicorn (the default) or granian (the optional extra poolgate[granian])
    http: Literal["uvicorn", "granian"] = "uvicorn"
    health_interval: float = Field(10.0, gt=0)  # seconds between health probes of remote workers
    max_in_flight: int = Field(0, ge=0)           # requests in flight in all; 0: no global limit
    max_in_flight_per_key: int = Field(0, ge=0)   # per API key name; 0: no limit
    queue_timeout: float = Field(5.0, ge=0)       # how long a request waits for a slot, then 429/529
    stream_grace: float = Field(2.0, ge=0)        # a stream's headers wait this long for the first event
    ping_interval: float = Field(10.0, gt=0)      # keep-alive ping after this much stream silence
    demo: bool = False  # no workers configured: serve the built-in demo upstream, not the default model
    cache_dir: str = "~/.cache/poolgate"  # downloads (the default model when it is not installed)

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, url: str | None) -> str | None:
        if not url:
            return None
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        return url

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, url: SecretStr | None) -> SecretStr | None:
        if url is None or not url.get_secret_value():
            return None
        if not url.get_secret_value().startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ValueError("database_url must start with sqlite:// or postgresql://")
        return url

    @field_validator("runtime_secret_envs")
    @classmethod
    def _check_secret_envs(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return names

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, keys: dict[str, SecretStr]) -> dict[str, SecretStr]:
        seen: dict[str, str] = {}
        for name, secret in keys.items():
            if not _NAME.match(name):
                raise ValueError(f"api key name {name!r} must be letters, digits, '.', '_' or '-'")
            if name == ANONYMOUS:
                raise ValueError(f"api key name {name!r} is reserved (requests without a key)")
            value = secret.get_secret_value()
            if not value:
                raise ValueError(f"api key {name!r} is empty")
            if value in seen:
                raise ValueError(f"api keys {seen[value]!r} and {name!r} have the same secret")
            seen[value] = name
        return keys

    @model_validator(mode="after")
    def _check_policy_keys(self) -> ServerSettings:
        for name, key in self.keys.items():
            if not _NAME.match(name):
                raise ValueError(f"key name {name!r} must be letters, digits, '.', '_' or '-'")
            if name == ANONYMOUS:
                raise ValueError(f"key name {name!r} is reserved (requests without a key)")
            if name in self.api_keys:
                raise ValueError(f"key {name!r} is both in api_keys and in keys")
        owners: dict[str, str] = {}  # secret -> the first key name holding it
        named = [(n, s.get_secret_value()) for n, s in self.api_keys.items()]
        named += [(n, k.secret.get_secret_value()) for n, k in self.keys.items() if k.secret]
        for name, secret in named:
            first = owners.setdefault(secret, name)
            if first != name:  # the operator's own config: naming both keys reveals nothing
                raise ValueError(f"keys {first!r} and {name!r} have the same secret: each key "
                                 "name needs its own")
        return self

    def plain_api_keys(self) -> dict[str, str]:
        """name -> secret, for ``auth.keys.KeyRing``."""
        return {name: secret.get_secret_value() for name, secret in self.api_keys.items()}

    @property
    def needs_insecure_opt_in(self) -> bool:
        """Listening beyond loopback with no API keys: refused unless explicitly allowed."""
        return not self.api_keys and not self.keys and not is_loopback_host(self.host)


class RoutingSettings(BaseModel):
    """The ``[routing]`` table: how a request picks among a model's workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["session_affinity", "least_in_flight", "prefix_cache"] = "session_affinity"
    models: dict[str, Literal["session_affinity", "least_in_flight", "prefix_cache"]] = Field(
        default_factory=dict)
    # a model name nothing serves (nor matches an alias or a glob alias such as
    # "claude-*") goes to this served model instead of a 404; None: a 404
    default_model: str | None = None
    binding_ttl: float = Field(3600.0, gt=0)
    max_bindings: int = Field(100_000, gt=0)
    # which account signed which thinking block (so none is sent to another account):
    # at most max_signatures digests in memory, each kept signature_ttl seconds
    signature_ttl: float = Field(7 * 86400.0, gt=0)
    max_signatures: int = Field(100_000, gt=0)
    # an implicit session (content hash, `user`) leaves a worker holding more than
    # imbalance_abs requests more than the least loaded AND imbalance_rel times as many
    imbalance_abs: int = Field(2, ge=0)
    imbalance_rel: float = Field(1.5, ge=1)
    cooldown_seconds: float = Field(5.0, ge=0)
    # cli accounts (docs/accounts.md, "Routing by quota"): a new conversation goes to the
    # account with the most headroom (false: the policy alone chooses); quota_reserve maps
    # a model (or alias) to the percent of each account's quota kept back from new
    # conversations (a worker's own quota_reserve wins)
    quota_routing: bool = True
    quota_reserve: dict[str, float] = Field(default_factory=dict)
    # the prefix_cache policy: prompts cut in blocks of prefix_block_chars characters;
    # a worker's match counts from prefix_min_match characters; per worker at most
    # prefix_max_blocks blocks, each forgotten prefix_max_age seconds after its last use
    prefix_block_chars: int = Field(128, ge=16, le=65_536)
    prefix_min_match: int = Field(256, ge=1)
    prefix_max_blocks: int = Field(20_000, ge=1)
    prefix_max_age: float = Field(600.0, gt=0)


    @field_validator("quota_reserve")
    @classmethod
    def _check_quota_reserve(cls, reserves: dict[str, float]) -> dict[str, float]:
        for model, percent in reserves.items():
            if not 0 <= percent <= 100:
                raise ValueError(f"quota_reserve[{model!r}] must be a percent from 0 to 100, "
                                 f"not {percent:g}")
        return reserves


class ResponsesSettings(BaseModel):
    """The ``[responses]`` table: bounds of the stored Responses (``store: true``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_items: int = Field(10_000, gt=0)
    max_bytes: int = Field(256 * 2**20, gt=0)
    max_age_seconds: float = Field(30 * 24 * 3600, gt=0)


class CliSessionSettings(BaseModel):
    """The ``[cli_sessions]`` table: bounds of the upstream session cache of cli workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_entries: int = Field(10_000, gt=0)
    max_age_seconds: float = Field(6 * 3600, gt=0)


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

"""The ``[server]``, ``[routing]``, ``[responses]`` and ``[cli_sessions]`` tables
of :class:`app.settings.Settings` (re-exported there, where the rest of the
code imports them from)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from auth.keys import ANONYMOUS

from .key_settings import KeySettings

__all__ = ["ServerSettings", "RoutingSettings", "ResponsesSettings", "CliSessionSettings",
           "LogLevel", "is_loopback_host"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

LogLevel = Literal["critical", "error", "warning", "info", "debug"]


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

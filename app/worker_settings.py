"""Worker settings: one ``[[workers]]`` entry of the configuration (remote,
process, local and cli workers), validated at the edge; ``app.settings``
builds the whole configuration from them."""

from __future__ import annotations

import os
import re
from typing import Any, Literal, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .account_settings import LoginSettings

__all__ = ["SamplingDefaultsSettings", "QuotaWindowSettings", "WorkerSettings", "default_model_name", "check_homes", "check_proxy_url", "DEFAULT_LOCAL_MODEL",
           "EMBEDDED_SAMPLING", "DEFAULT_WORKER"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SamplingDefaultsSettings(BaseModel):
    """A local worker's ``sampling_defaults``: what a request gets for what it
    leaves out (the client's values always win; these win over the model's own
    ``generation_config.json`` / GGUF ``general.sampling.*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, gt=0)


class QuotaWindowSettings(BaseModel):
    """One of a cli worker's ``quota_windows``: the gateway counts the account's
    tokens in a window of ``seconds`` against ``tokens`` (for a CLI that reports
    no quota of its own; docs/cli-workers.md, "Quota")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
    seconds: float = Field(gt=0, le=400 * 86400)
    tokens: int = Field(gt=0)


class WorkerSettings(BaseModel):
    """One ``[[workers]]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["remote", "process", "local", "cli"] = "remote"
    # remote: an HTTP endpoint
    dialect: Literal["openai", "anthropic", "gemini"] | None = None
    url: str | None = None
    # process: a worker program of ours, supervised, speaking poolgate's worker protocol
    # (cli: the vendor binary, default found on PATH)
    command: tuple[str, ...] = ()
    # extra environment of the child; a key NAME_env = "VAR" sets NAME from the
    # gateway's environment variable VAR (secrets never go in the file)
    env: dict[str, str] = Field(default_factory=dict)
    env_secrets: dict[str, SecretStr] = Field(default_factory=dict)  # resolved from env's *_env
    # the gateway's own variables a process/local child also gets, beyond the
    # default allow-list (pool/childenv.py); nothing else of its environment passes
    env_passthrough: tuple[str, ...] = ()
    cwd: str | None = None
    # local: a model engine in a supervised child process (see docs/workers.md)
    engine: Literal["llamacpp", "transformers", "vllm", "sglang"] | None = None
    model: str | None = None  # a GGUF file (llamacpp), an HF folder or hub id; None: the embedded default
    context_length: int | None = Field(None, gt=0)  # tokens per sequence; None: the model's own
    capacity: int = Field(4, gt=0)  # sequences the engine runs in parallel
    threads: int | None = Field(None, gt=0)  # CPU threads of the engine
    gpu_ids: tuple[int, ...] | None = None  # CUDA devices (CUDA_VISIBLE_DEVICES)
    engine_args: dict[str, Any] = Field(default_factory=dict)  # engine-specific settings
    chat_template: str | None = None  # a Jinja chat template file replacing the model's own
    # what requests get for sampling they leave out; None: the model's own (embedded default:
    # its model card's temperature 0.2, top_p 0.9, and short answers)
    sampling_defaults: SamplingDefaultsSettings | None = None
    python: str | None = None  # the interpreter whose environment has the engine
    # cli: a vendor coding CLI, one account per worker (see docs/cli-workers.md)
    cli: Literal["claude", "codex", "qwen", "gemini", "jsonrpc"] | None = None
    home: str | None = None  # the account's config home (CLAUDE_CONFIG_DIR / CODEX_HOME / HOME)
    mode: Literal["chat", "agent"] = "chat"
    max_conversations: int = Field(4, gt=0)  # processes (claude, qwen) or threads (codex) kept warm
    tool_timeout: float = Field(300.0, gt=0)  # a held client tool call is released after this
    conversation_idle: float = Field(900.0, gt=0)  # an idle conversation is closed after this
    cli_options: dict[str, Any] = Field(default_factory=dict)  # driver-specific (jsonrpc methods)
    # agent mode: what the CLI's tools run in (pool/cli/sandbox.py); "auto" takes the strongest
    # that works here and refuses agent mode when none does; "none" must be written out
    sandbox: Literal["auto", "bwrap", "uid", "none"] = "auto"
    sandbox_paths: tuple[str, ...] = ()  # more paths the sandbox shows read-only
    workspace_root: str | None = None  # agent mode: one workspace per key; default <home>-workspaces
    login_timeout: float = Field(600.0, gt=0)  # a login ends by then, code or not (its locks freed)
    # a refused account is tried again (a one-token turn) after this, doubling up to an hour
    login_probe_interval: float = Field(60.0, gt=0)
    # cli: the percent of the account's quota (its tightest window) kept back from new
    # conversations; below it the account serves only those it holds. None: the model's
    # [routing.quota_reserve], else 0
    quota_reserve: float | None = Field(None, ge=0, le=100)
    # cli: windows the gateway counts the account's tokens in (CLIs that report no quota)
    quota_windows: tuple[QuotaWindowSettings, ...] = Field((), max_length=8)
    # cli: the account's logged-in files at start-up (a session bundle, docs/accounts.md)
    bundle: str | None = None  # a bundle file (tar.gz)
    bundle_env: str | None = None  # an environment variable holding a bundle, base64
    bundle_b64: SecretStr | None = None  # resolved from bundle_env
    login: LoginSettings | None = None  # [workers.login]: automatic login
    ready_timeout: float | None = Field(None, gt=0)  # default 30 s (process), 600 s (local)
    health_interval: float = Field(5.0, gt=0)
    health_timeout: float = Field(2.0, gt=0)
    backoff_initial: float = Field(0.5, gt=0)
    backoff_max: float = Field(30.0, gt=0)
    crash_loop_threshold: int = Field(5, gt=0)
    crash_loop_window: float = Field(60.0, gt=0)
    stop_timeout: float = Field(10.0, gt=0)
    call_timeout: float = Field(30.0, gt=0)   # local: count_tokens / engine stats deadline
    read_timeout: float = Field(120.0, gt=0)  # local: longest the engine may go without a token
    api_key_env: str | None = None
    api_key: SecretStr | None = None  # resolved from api_key_env
    # cli and remote: every upstream request of the account goes through this
    # egress proxy (http://; socks5:// for remote workers); it may carry credentials
    proxy: SecretStr | None = None
    proxy_env: str | None = None  # an environment variable holding the proxy URL
    models: tuple[str, ...] = ()  # a local worker defaults to the model file's name
    aliases: dict[str, str] = Field(default_factory=dict)
    connect_timeout: float = Field(10.0, gt=0)
    first_byte_timeout: float = Field(300.0, gt=0)
    idle_timeout: float = Field(300.0, gt=0)
    max_connections: int = Field(0, ge=0)  # 0: unlimited
    max_in_flight: int = Field(256, gt=0)  # requests in flight on this worker before others wait
    # remote: what a same-dialect pass-through may carry beyond the defaults
    # (pool/remote/policy.py), and what happens to image URLs (pool/remote/images.py)
    pass_fields: tuple[str, ...] = ()
    pass_betas: tuple[str, ...] = ()
    server_tools: tuple[str, ...] = ()
    image_urls: Literal["data_only", "fetch", "forward"] = "data_only"
    image_max_bytes: int = Field(20 * 1024 * 1024, gt=0)

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"worker name {name!r} must be letters, digits, '.', '_' or '-'")
        return name

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not key or key == "_env":
                raise ValueError("env names must not be empty")
        return env

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url {url!r} must be an http:// or https:// URL with a host")
        return url.rstrip("/")

    @field_validator("models")
    @classmethod
    def _check_models(cls, models: tuple[str, ...]) -> tuple[str, ...]:
        if any(not m for m in models):
            raise ValueError("model names must not be empty")
        if len(set(models)) != len(models):
            raise ValueError("model names must be unique within a worker")
        return models

    @model_validator(mode="after")
    def _check_kind_fields(self) -> WorkerSettings:
        if self.kind == "local":
            if self.engine is None:
                raise ValueError("a local worker needs an engine ('llamacpp', 'transformers', "
                                 "'vllm' or 'sglang')")
            if self.model is None and self.engine != "llamacpp":
                raise ValueError(f"a local {self.engine} worker needs a model (an HF folder or hub id)")
            if not self.models:
                object.__setattr__(self, "models", (default_model_name(self.model),))
            return self
        if not self.models:
            raise ValueError("a worker needs at least one model")
        if self.quota_reserve is not None and self.kind != "cli":
            raise ValueError("quota_reserve: only cli workers (accounts) report a quota")
        if self.kind == "cli":
            missing = [f for f in ("cli", "home") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"a cli worker needs {' and '.join(missing)}")
            return self
        if self.kind == "remote":
            missing = [f for f in ("dialect", "url") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"a remote worker needs {' and '.join(missing)}")
        elif not self.command:
            raise ValueError("a process worker needs a command (a list: program and arguments)")
        return self

    @model_validator(mode="after")
    def _check_proxy_kind(self) -> WorkerSettings:
        if self.proxy is None and self.proxy_env is None:
            return self
        if self.kind not in ("cli", "remote"):
            raise ValueError("proxy: only cli and remote workers go through an egress proxy")
        if self.proxy is not None and self.proxy_env is not None:
            raise ValueError("proxy: give the proxy URL or proxy_env, not both")
        if self.proxy is not None:
            check_proxy_url(self.proxy.get_secret_value(), self.kind)
        return self

    @model_validator(mode="after")
    def _check_quota_windows(self) -> WorkerSettings:
        if self.quota_windows and self.kind != "cli":
            raise ValueError("quota_windows: only a cli worker counts its account's tokens")
        names = [w.name for w in self.quota_windows]
        if len(set(names)) != len(names):
            raise ValueError("quota_windows: each window needs a name of its own")
        return self

    @model_validator(mode="after")
    def _check_aliases(self) -> WorkerSettings:
        for alias, target in self.aliases.items():
            if not alias:
                raise ValueError("alias names must not be empty")
            if target not in self.models:
                raise ValueError(f"alias {alias!r} points at {target!r}, which this worker does not serve")
            if alias in self.models and alias != target:
                raise ValueError(f"alias {alias!r} shadows a model of the same name")
        return self

    def resolve(self, name: str) -> str | None:
        """The model this worker runs for ``name`` (a model or one of its aliases), else None."""
        if name in self.models:
            return name
        return self.aliases.get(name)


PROXY_SCHEMES = {"cli": ("http",), "remote": ("http", "socks5", "socks5h")}


def check_proxy_url(url: str, kind: str = "remote") -> None:
    """ValueError (naming ``proxy``, never quoting the URL: it may hold a
    password) unless ``url`` is an egress proxy a ``kind`` worker can use."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("proxy: not a valid URL") from None
    schemes = PROXY_SCHEMES.get(kind, PROXY_SCHEMES["remote"])
    if parts.scheme.startswith("socks") and kind == "cli":
        # verified on the real binaries (docs/cli-workers.md): Claude Code sends
        # its requests direct with a socks5:// ALL_PROXY, Qwen Code and Codex fail
        raise ValueError("proxy: a cli worker goes through an http:// proxy; the vendor CLIs "
                         "do not honour socks5:// (Claude Code would go around it)")
    if parts.scheme not in schemes:
        raise ValueError(f"proxy: must be an {' or '.join(s + '://' for s in schemes)} URL")
    if not parts.hostname or port is None:
        raise ValueError("proxy: needs a host and a port (e.g. http://proxy.internal:3128)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("proxy: must not have a path, query or fragment")


def default_model_name(model: str | None) -> str:
    """The name a local worker serves its model under when ``models`` is not given."""
    if model is None:
        return DEFAULT_LOCAL_MODEL
    base = model.rstrip("/").rsplit("/", 1)[-1]
    return base[:-5] if base.lower().endswith(".gguf") else base


DEFAULT_LOCAL_MODEL = "smollm2-135m-instruct"
# SmolLM2's model card recommends temperature 0.2 and top_p 0.9; a demo answer stays short.
EMBEDDED_SAMPLING = SamplingDefaultsSettings(temperature=0.2, top_p=0.9, max_tokens=256)


DEFAULT_WORKER = WorkerSettings(name="local", kind="local", engine="llamacpp", capacity=4,
                                 context_length=4096)


def check_homes(workers: Sequence[WorkerSettings]) -> None:
    """Each cli worker has a home of its own: two CLIs in one home (or one home
    inside another) would share credentials, rotate each other's refresh tokens
    and load each other's sessions. ValueError naming both workers."""
    seen: list[tuple[str, str]] = []  # (real path, worker)
    for worker in workers:
        if worker.kind != "cli" or worker.home is None:
            continue
        real = os.path.realpath(os.path.expanduser(worker.home))
        for other_real, other in seen:
            if real == other_real or os.path.commonpath((real, other_real)) in (real, other_real):
                how = "the same home" if real == other_real else "nested homes"
                raise ValueError(f"cli workers {other!r} and {worker.name!r} share {how} "
                                 f"({other_real} and {real}): each account needs a home of "
                                 "its own")
        seen.append((real, worker.name))

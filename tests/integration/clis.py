"""Drive the real Claude Code, Qwen Code and Codex CLIs, offline, against a local server.

The CLIs come from npm and are installed once into ``<repo>/.cache/npm``
(gitignored). Every run gets a fresh environment built from scratch (no
variable of the calling process leaks in), an isolated HOME, every switch
that keeps the CLI off the network except for the base URL it is given, and
a hard timeout after which its whole process group is killed.

Versions are pinned to the ones the fixtures in ``fixtures/clients`` were
recorded with; a run of Claude Code or Qwen Code against a fake upstream
takes 1-3 s, one of Codex (``codex exec``) under a second.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio.to_thread

__all__ = [
    "CLAUDE_CODE",
    "CODEX",
    "CODEX_KEY_VAR",
    "GEMINI_CLI",
    "GEMINI_PREFIX",
    "QWEN_CODE",
    "CLIError",
    "CLITimeout",
    "arun_claude",
    "arun_codex",
    "arun_qwen",
    "claude_env",
    "codex_args",
    "codex_env",
    "command_executions",
    "ensure_cli",
    "final_message",
    "gemini_env",
    "qwen_env",
    "result_event",
    "run_claude",
    "run_codex",
    "run_gemini",
    "run_qwen",
    "tool_results",
    "turn_completed",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# POOLGATE_NPM_PREFIX: another prefix, to try other versions without touching the shared cache
NPM_PREFIX = Path(os.environ.get("POOLGATE_NPM_PREFIX") or REPO_ROOT / ".cache" / "npm")

# package -> version the real tier runs. The fixtures were recorded with Claude Code
# 2.1.197, Qwen Code 0.15.10 and Codex 0.169.0; these newer versions still send what
# the gateway must accept (test_cli_clients), and the drivers work with both (the
# real tier passed on both, see docs/cli-workers.md).
PINNED_VERSIONS: Mapping[str, str] = {
    "@anthropic-ai/claude-code": "2.1.332",
    "@qwen-code/qwen-code": "0.24.4",
    "@openai/codex": "0.171.0",
    "@google/gemini-cli": "0.61.0",
}
CLAUDE_CODE = ("@anthropic-ai/claude-code", "claude")
QWEN_CODE = ("@qwen-code/qwen-code", "qwen")
CODEX = ("@openai/codex", "codex")
GEMINI_CLI = ("@google/gemini-cli", "gemini")
#: Gemini CLI gets a prefix of its own (its dependencies do not mix with the others')
GEMINI_PREFIX = REPO_ROOT / ".cache" / "npm-gemini"

_NPM_INSTALL_TIMEOUT = 600.0
# Variables a CLI may read from a minimal environment; everything else is unset.
_BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ")


class CLIError(RuntimeError):
    """The CLI exited non-zero; carries what it printed."""

    def __init__(self, argv0: str, returncode: int, stderr: str, events: list[dict],
                 pid: int | None = None) -> None:
        super().__init__(f"{argv0} exited {returncode}: {stderr.strip()[-2000:]}")
        self.pid = pid
        self.returncode = returncode
        self.stderr = stderr
        self.events = events


class CLITimeout(CLIError):
    """The CLI did not finish in time and was killed."""


def _split_spec(package: str) -> tuple[str, str]:
    """``name`` or ``name@version`` (scoped names start with ``@``)."""
    at = package.rfind("@")
    if at > 0:
        return package[:at], package[at + 1 :]
    return package, PINNED_VERSIONS.get(package, "latest")


def _installed_version(name: str, prefix: Path = NPM_PREFIX) -> str | None:
    manifest = prefix / "node_modules" / name / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def ensure_cli(package: str, bin_name: str, prefix: Path = NPM_PREFIX) -> str | None:
    """Install ``package`` (pinned, or ``name@version``) under ``prefix``
    (``.cache/npm``) unless already there, and return the path of its
    ``bin_name`` executable.

    Returns None when npm is not on PATH; raises CLIError if the install fails.
    """
    npm = shutil.which("npm")
    if npm is None:
        return None
    name, version = _split_spec(package)
    binary = prefix / "node_modules" / ".bin" / bin_name
    prefix.mkdir(parents=True, exist_ok=True)
    # One installer at a time (pytest-xdist workers share the cache).
    with open(prefix / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = _installed_version(name, prefix)
        if binary.exists() and current is not None and version in ("latest", current):
            return str(binary)
        argv = [npm, "install", "--prefix", str(prefix), "--save-exact",
                "--no-audit", "--no-fund", "--loglevel=error", f"{name}@{version}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_NPM_INSTALL_TIMEOUT,
                              stdin=subprocess.DEVNULL, check=False)
        if proc.returncode != 0 or not binary.exists():
            raise CLIError("npm install", proc.returncode, proc.stderr, [])
    return str(binary)


def _base_env(home: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _BASE_ENV_KEYS if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        USER="poolgate-test",
        TMPDIR=str(tmp),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        TERM="dumb",
        NO_COLOR="1",
        CI="1",
        NO_BROWSER="1",
        # Belt and braces: nothing but loopback is reachable anyway.
        NO_PROXY="127.0.0.1,localhost,::1",
        no_proxy="127.0.0.1,localhost,::1",
    )
    return env


def claude_env(base_url: str, api_key: str, *, model: str, home: Path,
               bearer: bool = False) -> dict[str, str]:
    """Environment for an offline, non-interactive ``claude -p``.

    Every model alias (the small/fast one used by subagents and background
    work included) resolves to ``model``, so all traffic is for a model the
    server knows. ``bearer`` sends the key as ``Authorization: Bearer``
    (ANTHROPIC_AUTH_TOKEN) instead of ``x-api-key`` (ANTHROPIC_API_KEY).
    """
    env = _base_env(home)
    env.update(
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_MODEL=model,
        ANTHROPIC_SMALL_FAST_MODEL=model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=model,
        ANTHROPIC_DEFAULT_SONNET_MODEL=model,
        ANTHROPIC_DEFAULT_OPUS_MODEL=model,
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_UPDATES="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_GROWTHBOOK="1",
        DISABLE_INSTALLATION_CHECKS="1",
        DISABLE_COST_WARNINGS="1",
        CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL="1",
        CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY="1",
        CLAUDE_CODE_DISABLE_TERMINAL_TITLE="1",
        CLAUDE_CODE_DISABLE_AUTO_MEMORY="1",
    )
    env["ANTHROPIC_AUTH_TOKEN" if bearer else "ANTHROPIC_API_KEY"] = api_key
    return env


# Written to <home>/.qwen/settings.json before the first run in that home.
_QWEN_SETTINGS = {
    "$version": 4,
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False},
    # The managed auto-memory pass sends a second, background chat request
    # after every turn; off, each turn is exactly the requests it needs.
    "memory": {"enableManagedAutoMemory": False},
    "security": {"auth": {"selectedType": "openai"}},
}


def qwen_env(base_url: str, api_key: str, *, model: str, home: Path,
             auth_type: str = "openai") -> dict[str, str]:
    """Environment for an offline, non-interactive Qwen Code in OpenAI mode, or
    (``auth_type="anthropic"``) in Anthropic mode, ``base_url`` then the server root."""
    settings = home / ".qwen" / "settings.json"
    if not settings.exists():
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(_QWEN_SETTINGS, indent=2))
    env = _base_env(home)
    if auth_type == "anthropic":
        env.update(ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY=api_key, ANTHROPIC_MODEL=model)
    else:
        env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, OPENAI_MODEL=model)
    env.update(
        QWEN_HOME=str(home / ".qwen"),
        # Otherwise it re-execs itself as a child node with a bigger heap.
        QWEN_CODE_NO_RELAUNCH="true",
        QWEN_DISABLE_AUTO_TITLE="1",
        QWEN_CODE_DISABLE_PRECONNECT="1",
    )
    return env


def _parse_json_lines(text: str) -> list[dict]:
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float, check: bool) -> list[dict]:
    # A session of its own makes the CLI's pid its process-group id, so on
    # timeout the CLI and every child it spawned (shells, ripgrep) go at once.
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a daemonised grandchild holds the pipes
            out, err = "", ""
        raise CLITimeout(argv[0], -9, f"timed out after {timeout}s\n{err}",
                         _parse_json_lines(out), proc.pid) from None
    finally:
        # Also reaps children the CLI left behind in its group (a background
        # shell): while any member lives the group id cannot be reused.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    events = _parse_json_lines(out)
    if check and proc.returncode != 0:
        raise CLIError(argv[0], proc.returncode, err, events, proc.pid)
    return events


def run_claude(
    base_url: str,
    api_key: str,
    prompt: str,
    *,
    model: str,
    cwd: str | Path,
    home: str | Path,
    timeout: float = 120,
    extra_args: Sequence[str] = (),
    bearer: bool = False,
    check: bool = True,
) -> list[dict]:
    """Run ``claude -p PROMPT --output-format stream-json --verbose`` once and
    return its events (``system``/``init``, ``assistant``, ``user`` with
    tool results, and a final ``result``).

    ``base_url`` is the server root (no ``/v1``). Read-only tools on files
    under ``cwd`` (Read, Glob, Grep) run without asking; others need e.g.
    ``extra_args=("--allowedTools", "Bash")``.
    """
    binary = ensure_cli(*CLAUDE_CODE)
    if binary is None:
        raise CLIError("claude", -1, "npm is not installed", [])
    argv = [binary, "-p", prompt, "--output-format", "stream-json", "--verbose",
            "--model", model, *extra_args]
    env = claude_env(base_url, api_key, model=model, home=Path(home), bearer=bearer)
    return _run(argv, env, Path(cwd), timeout, check)


def run_qwen(
    base_url: str,
    api_key: str,
    prompt: str,
    *,
    model: str,
    cwd: str | Path,
    home: str | Path,
    timeout: float = 120,
    approval_mode: str = "default",
    extra_args: Sequence[str] = (),
    check: bool = True,
    auth_type: str = "openai",
) -> list[dict]:
    """Run ``qwen PROMPT --output-format stream-json --auth-type openai`` once
    and return its events (same shapes as Claude Code's stream-json).

    ``base_url`` is the OpenAI base URL (with ``/v1``); with
    ``auth_type="anthropic"`` the Anthropic one (the server root). In ``default`` approval
    mode only read-only tools are offered (read_file, list_directory, glob,
    grep_search, ...) and they run unasked; ``yolo`` adds run_shell_command,
    edit and write_file.
    """
    binary = ensure_cli(*QWEN_CODE)
    if binary is None:
        raise CLIError("qwen", -1, "npm is not installed", [])
    # The positional prompt is the supported one-shot form (-p is deprecated).
    argv = [binary, prompt, "--output-format", "stream-json", "--auth-type", auth_type,
            "--model", model, "--approval-mode", approval_mode, *extra_args]
    env = qwen_env(base_url, api_key, model=model, home=Path(home), auth_type=auth_type)
    return _run(argv, env, Path(cwd), timeout, check)


# --- Gemini CLI as a client ------------------------------------------------------------

# Written to <home>/.gemini/settings.json before the first run in that home.
_GEMINI_SETTINGS = {
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "security": {"auth": {"selectedType": "gemini-api-key"}},
}


def gemini_env(base_url: str, api_key: str, *, home: Path) -> dict[str, str]:
    """Environment for an offline ``gemini -p`` on an API key: the Gemini API
    at ``base_url`` (the server root: the CLI posts to
    ``<base_url>/v1beta/models/<model>:streamGenerateContent?alt=sse``)."""
    settings = home / ".gemini" / "settings.json"
    if not settings.exists():
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(_GEMINI_SETTINGS, indent=2))
    env = _base_env(home)
    env.update(GEMINI_API_KEY=api_key, GOOGLE_GEMINI_BASE_URL=base_url,
               GEMINI_CLI_TRUST_WORKSPACE="true")
    return env


def run_gemini(
    base_url: str,
    api_key: str,
    prompt: str,
    *,
    model: str,
    cwd: str | Path,
    home: str | Path,
    timeout: float = 120,
    approval_mode: str = "yolo",
    check: bool = True,
) -> list[dict]:
    """Run ``gemini -p PROMPT -o stream-json`` once and return its events
    (``init``, ``message`` deltas, ``tool_use``/``tool_result``, a final
    ``result``). Gemini CLI 0.61.0 (``.cache/npm-gemini``); in ``yolo``
    approval mode its tools run unasked."""
    binary = ensure_cli(*GEMINI_CLI, prefix=GEMINI_PREFIX)
    if binary is None:
        raise CLIError("gemini", -1, "npm is not installed", [])
    argv = [binary, "-p", prompt, "-o", "stream-json", "-m", model,
            "--approval-mode", approval_mode]
    return _run(argv, gemini_env(base_url, api_key, home=Path(home)), Path(cwd), timeout, check)


# --- Codex CLI ----------------------------------------------------------------------

# The variable named by the provider's ``env_key``: Codex reads the key from it.
CODEX_KEY_VAR = "POOLGATE_API_KEY"
_CODEX_PROVIDER = "poolgate"
# Every key is checked by --strict-config, so a rename in a newer Codex fails
# loudly instead of silently going back online. Values are TOML.
_CODEX_OFFLINE = (
    ("check_for_update_on_startup", "false"),
    ("analytics.enabled", "false"),   # else: ab.chatgpt.com
    ("feedback.enabled", "false"),
    ("features.plugins", "false"),    # else: git clone github.com/openai/plugins, chatgpt.com
    ("otel.exporter", '"none"'),
    ("history.persistence", '"none"'),
    ("approval_policy", '"never"'),   # nothing can be asked: exec has no one to ask
)
_DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def codex_env(api_key: str, *, home: Path) -> dict[str, str]:
    """Environment for an offline ``codex exec``: the key in CODEX_KEY_VAR and
    CODEX_HOME inside the isolated HOME (no login, no ``auth.json``)."""
    env = _base_env(home)
    env.update({CODEX_KEY_VAR: api_key, "CODEX_HOME": str(home / ".codex")})
    # Codex honours these: anything but loopback (NO_PROXY) would go to a
    # closed local port and fail at once, even on a machine with a network.
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = _DEAD_PROXY
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    return env


def codex_args(base_url: str, *, model: str, sandbox: str = "read-only") -> list[str]:
    """The ``codex exec`` switches (prompt excluded) that point it at
    ``base_url`` (ends in ``/v1``; Codex posts to ``<base_url>/responses``)
    through a custom Responses provider and keep it offline."""
    provider = f"model_providers.{_CODEX_PROVIDER}"
    overrides = [
        (f"{provider}.name", _toml_str("poolgate")),
        (f"{provider}.base_url", _toml_str(base_url)),
        (f"{provider}.env_key", _toml_str(CODEX_KEY_VAR)),
        (f"{provider}.wire_api", _toml_str("responses")),
        ("model_provider", _toml_str(_CODEX_PROVIDER)),
        ("model", _toml_str(model)),
        *_CODEX_OFFLINE,
    ]
    argv = ["exec", "--json", "--strict-config", "--ephemeral", "--skip-git-repo-check",
            "--color", "never", "--sandbox", sandbox]
    for key, value in overrides:
        argv += ["-c", f"{key}={value}"]
    return argv


def run_codex(
    base_url: str,
    api_key: str,
    prompt: str,
    *,
    model: str,
    cwd: str | Path,
    home: str | Path,
    timeout: float = 120,
    sandbox: str = "read-only",
    extra_args: Sequence[str] = (),
    check: bool = True,
) -> list[dict]:
    """Run ``codex exec --json PROMPT`` once and return its JSONL events:
    ``thread.started``, ``turn.started``, ``item.started``/``item.completed``
    (items of type ``agent_message``, ``command_execution``, ``reasoning``,
    ``error``...), then ``turn.completed`` (usage) or ``turn.failed``.

    ``base_url`` is the Responses base URL (with ``/v1``). Commands the model
    asks for (``exec_command``) run unasked in the ``sandbox`` (``read-only``
    lets them read files in ``cwd``; ``workspace-write``, ``danger-full-access``
    also work as root here). A failed turn exits 1: CLIError when ``check``.
    """
    binary = ensure_cli(*CODEX)
    if binary is None:
        raise CLIError("codex", -1, "npm is not installed", [])
    home = Path(home)
    argv = [binary, *codex_args(base_url, model=model, sandbox=sandbox), *extra_args, "--", prompt]
    return _run(argv, codex_env(api_key, home=home), Path(cwd), timeout, check)


async def arun_claude(*args: object, **kwargs: object) -> list[dict]:
    """run_claude in a worker thread, for tests whose server shares the event loop."""
    return await anyio.to_thread.run_sync(lambda: run_claude(*args, **kwargs))


async def arun_qwen(*args: object, **kwargs: object) -> list[dict]:
    """run_qwen in a worker thread, for tests whose server shares the event loop."""
    return await anyio.to_thread.run_sync(lambda: run_qwen(*args, **kwargs))


async def arun_codex(*args: object, **kwargs: object) -> list[dict]:
    """run_codex in a worker thread, for tests whose server shares the event loop."""
    return await anyio.to_thread.run_sync(lambda: run_codex(*args, **kwargs))


def result_event(events: Sequence[dict]) -> dict:
    """The final ``{"type": "result", ...}`` event; raises if the run had none."""
    for event in reversed(events):
        if event.get("type") == "result":
            return event
    raise AssertionError(f"no result event among {[e.get('type') for e in events]}")


def tool_results(events: Sequence[dict]) -> list[dict]:
    """The ``tool_result`` blocks the CLI produced by running tools locally."""
    blocks = []
    for event in events:
        if event.get("type") != "user":
            continue
        content = event.get("message", {}).get("content")
        if isinstance(content, list):
            blocks.extend(b for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
    return blocks


def _completed_items(events: Sequence[dict], kind: str) -> list[dict]:
    return [e["item"] for e in events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == kind]


def turn_completed(events: Sequence[dict]) -> dict:
    """Codex's final ``turn.completed`` event (it carries ``usage``); raises
    with the error when the turn failed or never ended."""
    for event in reversed(events):
        if event.get("type") == "turn.completed":
            return event
        if event.get("type") == "turn.failed":
            raise AssertionError(f"codex turn failed: {event.get('error')}")
    raise AssertionError(f"no turn.completed among {[e.get('type') for e in events]}")


def final_message(events: Sequence[dict]) -> str:
    """The text of Codex's last ``agent_message`` in a completed turn."""
    turn_completed(events)
    messages = _completed_items(events, "agent_message")
    if not messages:
        raise AssertionError(f"no agent_message among {[e.get('type') for e in events]}")
    return messages[-1]["text"]


def command_executions(events: Sequence[dict]) -> list[dict]:
    """The commands Codex ran locally, as completed ``command_execution`` items
    (``command``, ``aggregated_output``, ``exit_code``, ``status``)."""
    return _completed_items(events, "command_execution")

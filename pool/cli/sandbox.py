"""Agent mode's sandbox: what a tool run by a vendor CLI can see.

In agent mode the client makes the CLI run tools (a shell, file reads) as the
account's process. Without a sandbox that is the gateway's own user: the
gateway's environment (``/proc/<pid>/environ``), its configuration, every
account's credential home and every key's workspace are one ``cat`` away.

A worker's ``sandbox`` setting picks what stands in between:

``bwrap``
    Each CLI process runs under bubblewrap: new PID, IPC and UTS namespaces
    (a ``/proc`` of its own, so no other process's environment), ``/usr`` and
    a short list of ``/etc`` read-only, an empty ``/tmp``, the account's home
    and the conversation's workspace read-write, the CLI's own program
    directories read-only; nothing else of the host's filesystem.
``uid``
    (poolgate running as root) Each CLI process runs as a uid of its own per
    account (``setpriv``); the account's home and workspaces are owned by it,
    0700. Weaker than ``bwrap``: what the host leaves world-readable stays
    readable.
``cli``
    (only chosen by ``auto``) The CLI's own sandbox: Codex runs its shell
    tools under its own ``read-only``/``workspace-write`` sandbox.
``none``
    Nothing: written out by the operator, never chosen by ``auto``.

``auto`` (the default) takes the strongest that works on this machine
(bubblewrap is probed by running it), and refuses agent mode, saying why,
when none does. Chat mode runs no tools and needs none.

Each API key gets a workspace of its own in agent mode
(``<workspace_root>/<key>``), outside the credential home.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import zlib
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

__all__ = ["Sandbox", "SandboxUnavailable", "SandboxSetting", "resolve_sandbox", "key_dir"]

SandboxSetting = Literal["auto", "bwrap", "uid", "none"]
Kind = Literal["bwrap", "uid", "cli", "none"]

#: what a CLI and its tools need of /etc (names, resolver, certificates, time zone)
_ETC = ("resolv.conf", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "passwd", "group",
        "ssl", "ca-certificates", "ca-certificates.conf", "alternatives", "localtime",
        "timezone", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "mime.types", "os-release",
        "bash.bashrc", "profile", "inputrc", "terminfo", "gitconfig")
_TOP = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_SAFE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_UID_BASE, _UID_SPAN = 200_000, 100_000


class SandboxUnavailable(ValueError):
    """Agent mode asked for a sandbox this machine cannot give (the message says why)."""


def key_dir(key: str | None) -> str:
    """The directory name of a key's workspace: the key's name when it is a plain
    name, else a digest of it (a name never walks out of the workspace root)."""
    if not key:
        return "_default"
    if _SAFE_KEY.match(key):
        return key
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Sandbox:
    """A resolved sandbox: :meth:`command` wraps a CLI's argv in it."""

    kind: Kind = "none"
    tool: str = ""                      # bwrap or setpriv
    home: str = ""                      # the account's config home (read-write)
    paths: tuple[str, ...] = ()         # read-only: the CLI's programs, extra paths
    uid: int | None = None

    @property
    def isolates(self) -> bool:
        return self.kind in ("bwrap", "uid")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tool": self.tool, "home": self.home,
                "paths": list(self.paths), "uid": self.uid}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Sandbox:
        if not data:
            return cls()
        return cls(kind=data["kind"], tool=data.get("tool", ""), home=data.get("home", ""),
                   paths=tuple(data.get("paths") or ()), uid=data.get("uid"))

    def prepare(self, *writable: str) -> None:
        """Create the writable directories (0700); under ``uid``, hand them and
        the home to the account's uid, and let it through the directories made
        above them (the workspace root: 0711, so a tool reaches its workspace by
        its absolute path, and lists no other)."""
        above: list[str] = []
        for path in writable:
            above += _missing_parents(path)
            os.makedirs(path, mode=0o700, exist_ok=True)
        if self.kind == "uid" and self.uid is not None:
            for top in (self.home, *writable):
                _chown_tree(top, self.uid)
            for folder in above:
                os.chmod(folder, 0o711)

    def command(self, argv: Sequence[str], *, cwd: str, writable: Sequence[str] = (),
                env: Mapping[str, str] | None = None) -> list[str]:
        """``argv`` run inside the sandbox, starting in ``cwd``; ``writable``
        (workspaces) are shown read-write besides the home."""
        if self.kind == "bwrap":
            # the programs by their real folders (only those are bound), their own names kept
            programs = _programs(argv)
            argv = [_real_folder(a) if i in programs else a for i, a in enumerate(argv)]
            args = _bwrap_base(self.tool)
            for path in _program_paths(argv, env or {}, self.paths):
                args += ["--ro-bind-try", path, path]
            for path in (self.home, *writable):
                args += ["--bind", path, path]
            env = env or {}
            if not _under(env.get("HOME", ""), (self.home, *writable)):
                args += ["--setenv", "HOME", self.home]  # the host's home is not there
            for name in ("TMPDIR", "TMP", "TEMP"):
                if env.get(name) and not _under(env[name], (self.home, *writable)):
                    args += ["--setenv", name, "/tmp"]  # the sandbox's own, empty /tmp
            return [*args, "--chdir", cwd, "--", *argv]
        if self.kind == "uid":
            return [self.tool, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                    "--", *argv]
        return list(argv)


def resolve_sandbox(setting: str, *, name: str, mode: str, cli: str, home: str,
                    env: Mapping[str, str], command: Sequence[str] = (),
                    paths: Sequence[str] = (), options: Mapping[str, Any] | None = None,
                    is_root: bool | None = None) -> Sandbox:
    """The sandbox worker ``name`` runs its CLI in. Raises
    :class:`SandboxUnavailable` naming why when agent mode asks for one that
    does not work here."""
    if mode != "agent" or setting == "none":
        return Sandbox()
    home = os.path.abspath(os.path.expanduser(home))
    extra = tuple(os.path.abspath(os.path.expanduser(p)) for p in paths)
    is_root = os.geteuid() == 0 if is_root is None else is_root
    tried: list[str] = []
    if setting in ("auto", "bwrap"):
        found = shutil.which("bwrap", path=env.get("PATH"))
        why = "bwrap is not on PATH (Debian: apt-get install bubblewrap)" if found is None \
            else _probe(_bwrap_base(found) + ["--", "true"], env)
        if why is None:
            return Sandbox(kind="bwrap", tool=found or "", home=home, paths=extra)
        tried.append(f"bwrap: {why}")
    if setting in ("auto", "uid"):
        found = shutil.which("setpriv", path=env.get("PATH"))
        uid = _UID_BASE + zlib.crc32(name.encode()) % _UID_SPAN
        if not is_root:
            why = "poolgate does not run as root (needed to switch to the account's uid)"
        elif found is None:
            why = "setpriv is not on PATH (Debian: util-linux)"
        else:
            why = _probe([found, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                          "true"], env)
        if why is None:
            return Sandbox(kind="uid", tool=found or "", home=home, paths=extra, uid=uid)
        tried.append(f"uid: {why}")
    if setting == "auto" and cli == "codex" and \
            (options or {}).get("sandbox", "read-only") != "danger-full-access":
        return Sandbox(kind="cli", home=home, paths=extra)
    if setting == "auto" and cli == "codex":
        tried.append("codex: cli_options.sandbox is danger-full-access")
    raise SandboxUnavailable(
        f"worker {name}: agent mode needs a sandbox and none works here ({'; '.join(tried)}); "
        "fix that, or set sandbox = \"none\" to run agent mode without one")


def _probe(argv: list[str], env: Mapping[str, str]) -> str | None:
    """None when ``argv`` runs and exits 0, else why not (its first stderr line)."""
    try:
        done = subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{os.path.basename(argv[0])} did not run ({type(exc).__name__})"
    if done.returncode == 0:
        return None
    first = done.stderr.decode(errors="replace").strip().splitlines()[:1]
    return f"exited with {done.returncode}" + (f": {first[0][:200]}" if first else "")


def _bwrap_base(bwrap: str) -> list[str]:
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--ro-bind", "/usr", "/usr"]
    for top in _TOP:
        path = "/" + top
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in _ETC:
        args += ["--ro-bind-try", "/etc/" + name, "/etc/" + name]
    return args + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp",
                   "--tmpfs", "/run"]


def _program_paths(argv: Sequence[str], env: Mapping[str, str],
                   extra: Sequence[str]) -> list[str]:
    """What the CLI's programs need read-only: for the executable and its script
    (:func:`_programs`, and where their links lead) the install each belongs to (an npm
    ``node_modules``, a ``bin``'s prefix, a virtualenv), the ``PYTHONPATH``
    entries when the CLI is a Python program, and the worker's ``sandbox_paths``."""
    found: list[str] = []
    for arg in (argv[i] for i in _programs(argv)):
        if not os.path.isabs(arg) or not os.path.exists(arg):
            continue
        for path in dict.fromkeys((arg, os.path.realpath(arg))):
            found.append(_install_root(path))
    if argv and os.path.basename(argv[0]).startswith("python"):  # a CLI written in Python
        found += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    found += extra
    found = [os.path.realpath(p) for p in found]  # bound where it is, not through links
    # parents before children: a nested bind lands on top of its parent's
    return sorted((p for p in dict.fromkeys(found) if p != "/" and not p.startswith("/usr/")),
                  key=len)


def _programs(argv: Sequence[str]) -> tuple[int, ...]:
    """Where the programs are in ``argv``: the executable, and the script an
    interpreter runs (its first argument that is not an option, as in
    ``node --expose-gc cli.js``)."""
    script = next((i for i, a in enumerate(argv[1:], 1) if not a.startswith("-")), None)
    return (0,) if script is None else (0, script)


def _real_folder(arg: str) -> str:
    if not os.path.isabs(arg) or not os.path.exists(arg):
        return arg
    return os.path.join(os.path.realpath(os.path.dirname(arg)), os.path.basename(arg))


def _install_root(path: str) -> str:
    parts = path.split(os.sep)
    if "node_modules" in parts:
        return os.sep.join(parts[:parts.index("node_modules") + 1])
    folder = os.path.dirname(path)
    return os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder


def _under(path: str, roots: Sequence[str]) -> bool:
    return bool(path) and any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _missing_parents(path: str) -> list[str]:
    """The directories above ``path`` that do not exist yet (made by us, then)."""
    found: list[str] = []
    parent = os.path.dirname(os.path.abspath(path))
    while parent != os.path.dirname(parent) and not os.path.exists(parent):
        found.append(parent)
        parent = os.path.dirname(parent)
    return found


def _chown_tree(top: str, uid: int) -> None:
    if not os.path.isdir(top):
        return
    os.chmod(top, 0o700)
    for root, dirs, files in os.walk(top):
        for name in (root, *(os.path.join(root, n) for n in (*dirs, *files))):
            os.lchown(name, uid, uid)

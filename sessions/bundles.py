"""Session bundles: the logged-in files of a cli worker's home as one tar.gz.

A bundle is ``manifest.json`` plus the files a CLI keeps its login in, paths
relative to the worker's ``home`` (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, or
Qwen's ``HOME``). The manifest names the CLI, its version, the account, when
the bundle was made and the sha256 of every file.

Import treats the archive as hostile: it is unpacked in memory with bounded
decompression, every member is checked (a regular file, a relative path on
the CLI's list, no ``..``, no link, device or fifo, at most
:data:`MAX_FILES` files and :data:`MAX_BYTES` unpacked), the manifest must
match the files exactly, and only then is anything written: each file 0600
into a staging directory inside the home, then renamed into place, and the
previous account's other allow-listed files deleted (the bundle is the
home's whole login). A home that is a link, or a link on the way to any
allow-listed file, is refused; nothing below the home is opened through a
link. A refusal
raises :class:`BundleError` with a message that names the problem and never
the contents.

Refresh tokens rotate: after import, the source of the bundle must not run
the same account any more (see docs/accounts.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import stat
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

__all__ = ["BUNDLE_FILES", "CREDENTIAL_FILES", "MAX_FILES", "MAX_BYTES", "BundleError",
           "Manifest", "export_bundle", "read_bundle", "import_bundle", "has_credentials",
           "fingerprint"]

#: the files of a logged-in home, per CLI, relative to the worker's ``home``
BUNDLE_FILES: Mapping[str, tuple[str, ...]] = {
    "claude": (".credentials.json", ".claude.json", "settings.json"),
    "codex": ("auth.json", "config.toml"),
    "qwen": (".qwen/settings.json", ".qwen/.env", ".env"),
    "gemini": (".gemini/oauth_creds.json", ".gemini/google_accounts.json",
               ".gemini/settings.json", ".gemini/.env", ".env"),
}
#: a home is logged in (as far as files tell) when one of these exists
CREDENTIAL_FILES: Mapping[str, tuple[str, ...]] = {
    "claude": (".credentials.json",),
    "codex": ("auth.json",),
    "qwen": (".qwen/settings.json", ".qwen/.env", ".env"),
    "gemini": (".gemini/oauth_creds.json", ".gemini/.env", ".env"),
}
MANIFEST = "manifest.json"
MAX_FILES = 64
MAX_BYTES = 16 * 1024 * 1024
# tar headers and padding on top of the files' bytes (512 per member, 10 KiB blocking)
_TAR_SLACK = (MAX_FILES + 1) * 1024 + 20 * 1024
_FORMAT = 1


class BundleError(ValueError):
    """The bundle cannot be made or imported; the message is safe to show."""


@dataclass(frozen=True, slots=True)
class Manifest:
    cli: str
    version: str | None
    account: str | None
    created: float
    files: Mapping[str, str] = field(default_factory=dict)  # path -> sha256 hex

    def as_dict(self) -> dict[str, object]:
        return {"format": _FORMAT, "cli": self.cli, "version": self.version,
                "account": self.account, "created": self.created,
                "files": {path: {"sha256": digest} for path, digest in self.files.items()}}

    def summary(self) -> dict[str, object]:
        """What an operator may see: no contents, only names and hash prefixes."""
        return {"cli": self.cli, "version": self.version, "account": self.account,
                "created": self.created, "files": sorted(self.files),
                "sha256": {p: d[:12] for p, d in self.files.items()}}


def fingerprint(data: bytes) -> str:
    """A short hash of a secret (a bundle, a code) for logs and status."""
    return hashlib.sha256(data).hexdigest()[:12]


def has_credentials(cli: str, home: str | os.PathLike[str]) -> bool:
    return any((Path(home) / name).is_file() for name in _files_of(cli, CREDENTIAL_FILES))


def export_bundle(cli: str, home: str | os.PathLike[str], *, version: str | None = None,
                  account: str | None = None, now: float | None = None) -> bytes:
    """The bundle of ``home`` (the files of ``BUNDLE_FILES[cli]`` that exist)."""
    root = Path(home)
    if not has_credentials(cli, root):
        raise BundleError(f"the {cli} home holds no login to export")
    contents: dict[str, bytes] = {}
    for name in _files_of(cli, BUNDLE_FILES):
        path = root / name
        if path.is_file() and not path.is_symlink():
            contents[name] = path.read_bytes()
    manifest = Manifest(cli, version, account, time.time() if now is None else now,
                        {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()})
    return pack({MANIFEST: json.dumps(manifest.as_dict(), indent=2).encode(), **contents})


def pack(members: Mapping[str, bytes]) -> bytes:
    """A tar.gz of regular 0600 files (also how tests build archives)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def read_bundle(data: bytes, cli: str) -> tuple[Manifest, dict[str, bytes]]:
    """Check a bundle for ``cli`` without writing anything: its manifest and files."""
    members = _unpack(data, set(_files_of(cli, BUNDLE_FILES)))
    manifest = _manifest(members.pop(MANIFEST, None), cli)
    if set(manifest.files) != set(members):
        missing = sorted(set(manifest.files) - set(members))
        extra = sorted(set(members) - set(manifest.files))
        raise BundleError(f"the manifest does not list the archive's files "
                          f"(missing: {missing}, not in the manifest: {extra})")
    for name, content in members.items():
        if hashlib.sha256(content).hexdigest() != manifest.files[name]:
            raise BundleError(f"{name}: its sha256 does not match the manifest")
    if not any(name in members for name in CREDENTIAL_FILES[cli]):
        raise BundleError(f"the bundle holds no {cli} login "
                          f"({' or '.join(CREDENTIAL_FILES[cli])})")
    return manifest, members


def import_bundle(data: bytes, cli: str, home: str | os.PathLike[str]) -> Manifest:
    """Check ``data`` and make it the home's whole login: its files written 0600
    (in 0700 directories), and every other file of ``BUNDLE_FILES[cli]`` the
    home held (the previous account's) deleted. All checks come before the
    first write. A home that is a link, or a link anywhere on the path of an
    allow-listed file inside it, is refused: every step below the home is
    opened relative to its parent with ``O_NOFOLLOW``, so a link planted
    between the check and the write is refused too, never followed."""
    manifest, members = read_bundle(data, cli)
    allowed = _files_of(cli, BUNDLE_FILES)
    root = Path(home)
    if root.is_symlink():
        raise BundleError("the worker's home is a link; refused (use the real directory)")
    root.parent.mkdir(parents=True, exist_ok=True)  # above the home: the operator's layout
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    home_fd = _open_dir(None, str(root), "the worker's home")
    try:
        os.fchmod(home_fd, 0o700)  # set again: the umask is not trusted either way
        for name in allowed:  # what is there must be a regular file or nothing, no link on the way
            _check_path(home_fd, name)
        _write_members(home_fd, members)
        for name in allowed:
            if name not in members:
                _remove(home_fd, name)
    finally:
        os.close(home_fd)
    return manifest


def _open_dir(dir_fd: int | None, name: str, shown: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:  # ELOOP (a link) or ENOTDIR: refused either way
        raise BundleError(f"{shown}: a link or not a directory in the home "
                          "(a link leads outside the home's files); refused") from None


def _parent_fd(home_fd: int, name: str, *, create: bool) -> int | None:
    """An fd of ``name``'s directory, every level opened without following
    links (and made 0700 when ``create``); None when it is missing."""
    fd = os.dup(home_fd)
    try:
        for part in Path(name).parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            else:
                try:
                    os.lstat(part, dir_fd=fd)
                except FileNotFoundError:
                    os.close(fd)
                    return None
            child = _open_dir(fd, part, f"{name}: {part}")
            os.close(fd)
            fd = child
            if create:
                os.fchmod(fd, 0o700)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_members(home_fd: int, members: Mapping[str, bytes]) -> None:
    """Each file 0600 into a staging directory inside the home, then renamed into place."""
    staging = f".bundle-import-{secrets.token_hex(8)}"
    os.mkdir(staging, 0o700, dir_fd=home_fd)
    staging_fd = _open_dir(home_fd, staging, "the staging directory")
    try:
        os.fchmod(staging_fd, 0o700)  # whatever the umask left of mkdir's mode
        for index, content in enumerate(members.values()):
            fd = os.open(str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=staging_fd)
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
        for index, name in enumerate(members):
            parent = _parent_fd(home_fd, name, create=True)
            assert parent is not None
            try:
                os.replace(str(index), Path(name).name, src_dir_fd=staging_fd, dst_dir_fd=parent)
            finally:
                os.close(parent)
    finally:
        for leftover in os.listdir(staging_fd):
            os.unlink(leftover, dir_fd=staging_fd)
        os.close(staging_fd)
        os.rmdir(staging, dir_fd=home_fd)


def _remove(home_fd: int, name: str) -> None:
    """Delete the previous account's ``name`` (a file the bundle does not hold)."""
    parent = _parent_fd(home_fd, name, create=False)
    if parent is None:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(Path(name).name, dir_fd=parent)
    finally:
        os.close(parent)


def _check_path(home_fd: int, name: str) -> None:
    fd = os.dup(home_fd)
    try:
        for part in Path(name).parts[:-1]:
            try:
                st = os.lstat(part, dir_fd=fd)
            except FileNotFoundError:
                return  # created fresh at write time
            if not stat.S_ISDIR(st.st_mode):
                raise BundleError(f"{name}: {part} in the home is a link or not a directory "
                                  "(a link leads outside the home's files); refused")
            child = _open_dir(fd, part, f"{name}: {part}")
            os.close(fd)
            fd = child
        try:
            st = os.lstat(Path(name).name, dir_fd=fd)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{name}: the home has a link or directory there; refused")
    finally:
        os.close(fd)


# --- checking an archive ---------------------------------------------------------------

def _files_of(cli: str, table: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    try:
        return table[cli]
    except KeyError:
        raise BundleError(f"no bundle format for cli {cli!r} "
                          f"(one of {', '.join(BUNDLE_FILES)})") from None


def _gunzip(data: bytes) -> bytes:
    """Decompress at most MAX_BYTES plus tar overhead: a bomb stops at the limit."""
    limit = MAX_BYTES + _TAR_SLACK
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error:
        raise BundleError("the bundle is not a gzip file") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise BundleError(f"the bundle unpacks to more than {MAX_BYTES} bytes")
    return out


def _unpack(data: bytes, allowed: set[str]) -> dict[str, bytes]:
    raw = _gunzip(data)
    members: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            infos = tar.getmembers()  # headers only; the archive is already bounded in memory
            if len(infos) > MAX_FILES + 1:  # the files and the manifest
                raise BundleError(f"the bundle has more than {MAX_FILES} files")
            for info in infos:
                name = _check_member(info, allowed | {MANIFEST})
                if name in members:
                    raise BundleError(f"{name}: appears twice in the archive")
                total += info.size
                if total > MAX_BYTES:
                    raise BundleError(f"the bundle unpacks to more than {MAX_BYTES} bytes")
                fh = tar.extractfile(info)
                members[name] = fh.read() if fh is not None else b""
    except tarfile.TarError as exc:
        raise BundleError(f"the bundle is not a valid tar archive ({type(exc).__name__})") from None
    return members


def _check_member(info: tarfile.TarInfo, allowed: set[str]) -> str:
    name = info.name
    shown = name if len(name) <= 120 and name.isprintable() else repr(name[:120])
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"{shown}: absolute paths are refused")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise BundleError(f"{shown}: paths with '..' are refused")
    if info.issym() or info.islnk():
        raise BundleError(f"{shown}: links are refused")
    if info.ischr() or info.isblk() or info.isfifo() or info.isdev():
        raise BundleError(f"{shown}: devices and fifos are refused")
    if not info.isreg():
        raise BundleError(f"{shown}: only regular files are accepted")
    clean = "/".join(p for p in parts if p not in ("", "."))
    if clean not in allowed:
        raise BundleError(f"{shown}: not one of the files a bundle may hold "
                          f"({', '.join(sorted(allowed))})")
    return clean


def _manifest(raw: bytes | None, cli: str) -> Manifest:
    if raw is None:
        raise BundleError(f"the bundle has no {MANIFEST}")
    try:
        data = json.loads(raw)
        files = {str(p): str(v["sha256"]) for p, v in data["files"].items()}
        manifest = Manifest(cli=str(data["cli"]), version=data.get("version"),
                            account=data.get("account"), created=float(data["created"]),
                            files=files)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BundleError(f"{MANIFEST} is not a valid manifest") from None
    if manifest.cli != cli:
        raise BundleError(f"the bundle is for {manifest.cli}, not {cli}")
    return manifest

"""Session bundles: a round trip, and a table of hostile archives each refused
with a clear error and nothing written (inside the home or next to it)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Callable

import pytest

from sessions.bundles import (MAX_BYTES, MAX_FILES, BundleError, export_bundle, import_bundle,
                              pack, read_bundle)

CREDS = json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat01-SECRET",
                                      "refreshToken": "sk-ant-ort01-SECRET"}}).encode()


def manifest(files: dict[str, bytes], cli: str = "claude") -> bytes:
    return json.dumps({"format": 1, "cli": cli, "version": "2.1.197", "account": "a@example.com",
                       "created": 1.0,
                       "files": {n: {"sha256": hashlib.sha256(d).hexdigest()}
                                 for n, d in files.items()}}).encode()


def good(files: dict[str, bytes] | None = None) -> dict[str, bytes]:
    files = files or {".credentials.json": CREDS, ".claude.json": b"{}"}
    return {"manifest.json": manifest(files), **files}


def tar_with(extra: Callable[[tarfile.TarFile], None], files: dict[str, bytes] | None = None) -> bytes:
    """A valid bundle plus whatever ``extra`` adds to the archive."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in good(files).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        extra(tar)
    return raw.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x",
           link: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return add


def bomb() -> bytes:
    """A gzip that inflates past the limit (a few KiB on the wire)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
        info = tarfile.TarInfo(".claude.json")
        info.size = MAX_BYTES + 1
        gz.write(info.tobuf())
        chunk = b"\0" * (1 << 20)
        for _ in range(17):
            gz.write(chunk)
    return raw.getvalue()


def too_many() -> bytes:
    def add(tar: tarfile.TarFile) -> None:
        for i in range(MAX_FILES + 1):
            member(f"junk{i}")(tar)
    return tar_with(add)


def tampered() -> bytes:
    members = good()
    members[".claude.json"] = b'{"oauthAccount": "someone else"}'
    return pack(members)


def unlisted() -> bytes:
    members = good()
    members["settings.json"] = b"{}"  # allowed name, but not in the manifest
    return pack(members)


HOSTILE = [
    ("traversal", lambda: tar_with(member("../escape.json")), "'..'"),
    ("nested traversal", lambda: tar_with(member("projects/../../x")), "'..'"),
    ("absolute", lambda: tar_with(member("/etc/cron.d/x")), "absolute"),
    ("symlink", lambda: tar_with(member("settings.json", tarfile.SYMTYPE, link="/etc/passwd")),
     "links"),
    ("hardlink", lambda: tar_with(member("settings.json", tarfile.LNKTYPE, link=".claude.json")),
     "links"),
    ("char device", lambda: tar_with(member("settings.json", tarfile.CHRTYPE)), "devices"),
    ("fifo", lambda: tar_with(member("settings.json", tarfile.FIFOTYPE)), "fifos"),
    ("directory", lambda: tar_with(member("projects", tarfile.DIRTYPE)), "regular files"),
    ("unknown file", lambda: tar_with(member(".bashrc")), "not one of the files"),
    ("gzip bomb", bomb, f"more than {MAX_BYTES} bytes"),
    ("too many files", too_many, f"more than {MAX_FILES} files"),
    ("hash mismatch", tampered, "sha256 does not match"),
    ("file not in manifest", unlisted, "does not list"),
    ("no manifest", lambda: pack({".credentials.json": CREDS}), "no manifest.json"),
    ("bad manifest", lambda: pack({"manifest.json": b"[1]", ".credentials.json": CREDS}),
     "not a valid manifest"),
    ("other cli", lambda: pack({"manifest.json": manifest({"auth.json": b"{}"}, "codex"),
                                ".claude.json": b"{}"}), "for codex, not claude"),
    ("no login in it", lambda: pack(good({".claude.json": b"{}"})), "holds no claude login"),
    ("duplicate", lambda: tar_with(member(".claude.json", data=b"{}")), "appears twice"),
    ("not gzip", lambda: b"PK\x03\x04 a zip", "not a gzip"),
    ("not tar", lambda: gzip.compress(b"hello" * 200), "not a valid tar"),
]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("name,build,message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_archives_are_refused_and_nothing_is_written(
        tmp_path: Path, name: str, build: Callable[[], bytes], message: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text('{"kept": true}')
    before, around = snapshot(home), snapshot(tmp_path)
    with pytest.raises(BundleError) as info:
        import_bundle(build(), "claude", home)
    assert message in str(info.value)
    assert "SECRET" not in str(info.value)
    assert snapshot(home) == before and snapshot(tmp_path) == around


def test_export_then_import_into_an_empty_home(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / ".credentials.json").write_bytes(CREDS)
    (src / ".claude.json").write_text('{"oauthAccount": {"emailAddress": "a@example.com"}}')
    (src / "projects").mkdir()  # not part of a bundle
    (src / "projects" / "x.jsonl").write_text("{}")
    data = export_bundle("claude", src, version="2.1.197", account="a@example.com", now=5.0)
    assert b"SECRET" not in data  # compressed, but the point is: it is the file, not a log
    m = import_bundle(data, "claude", dst)
    assert (m.cli, m.version, m.account, m.created) == ("claude", "2.1.197", "a@example.com", 5.0)
    assert sorted(m.files) == [".claude.json", ".credentials.json"]
    assert sorted(os.listdir(dst)) == [".claude.json", ".credentials.json"]
    for name in m.files:
        assert (dst / name).read_bytes() == (src / name).read_bytes()
        assert stat.S_IMODE((dst / name).stat().st_mode) == 0o600
    assert "SECRET" not in json.dumps(m.summary())


def test_qwen_files_go_into_their_directory_and_not_through_a_link(tmp_path: Path) -> None:
    files = {".qwen/settings.json": b'{"security": {"auth": {"apiKey": "k"}}}'}
    data = pack({"manifest.json": manifest(files, "qwen"), **files})
    m, members = read_bundle(data, "qwen")
    assert list(members) == [".qwen/settings.json"] and m.cli == "qwen"
    home = tmp_path / "home"
    import_bundle(data, "qwen", home)
    assert (home / ".qwen" / "settings.json").read_bytes() == files[".qwen/settings.json"]
    # a home whose .qwen is a link to elsewhere: refused, nothing written there
    other, outside = tmp_path / "other", tmp_path / "outside"
    other.mkdir()
    outside.mkdir()
    (other / ".qwen").symlink_to(outside)
    with pytest.raises(BundleError, match="leads outside"):
        import_bundle(data, "qwen", other)
    assert list(outside.iterdir()) == []


def test_export_refuses_a_home_without_a_login(tmp_path: Path) -> None:
    (tmp_path / ".claude.json").write_text("{}")
    with pytest.raises(BundleError, match="no login"):
        export_bundle("claude", tmp_path)
    with pytest.raises(BundleError, match="no bundle format"):
        export_bundle("lingma", tmp_path)


@pytest.mark.parametrize(("module", "forbidden"), [
    ("sessions/bundles.py", {"app", "auth", "pool"}),
    ("auth/autologin.py", {"app", "pool", "sessions"}),
    ("auth/recipes.py", {"app", "pool", "sessions"}),
    ("pool/cli/login.py", {"app", "sessions", "auth"}),
])
def test_account_modules_follow_the_package_direction(module: str, forbidden: set[str]) -> None:
    import ast

    path = Path(__file__).resolve().parents[2] / module
    imports: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            imports.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            imports.update(alias.name.split(".")[0] for alias in node.names)
    assert imports and not imports & forbidden


def _qwen_bundle(files: dict[str, bytes]) -> bytes:
    return pack({"manifest.json": manifest(files, "qwen"), **files})


def test_import_replaces_the_whole_login_and_keeps_the_rest(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".qwen" / "projects").mkdir(parents=True)
    (home / ".qwen" / "settings.json").write_text('{"security": {"auth": {"apiKey": "old"}}}')
    (home / ".qwen" / ".env").write_text("OPENAI_API_KEY=sk-previous-account\n")
    (home / ".env").write_text("OPENAI_API_KEY=sk-previous-account\n")
    (home / ".qwen" / "projects" / "notes.txt").write_text("not a login file")
    new = {".qwen/settings.json": b'{"security": {"auth": {"apiKey": "new"}}}'}
    import_bundle(_qwen_bundle(new), "qwen", home)
    assert (home / ".qwen" / "settings.json").read_bytes() == new[".qwen/settings.json"]
    assert not (home / ".qwen" / ".env").exists() and not (home / ".env").exists()
    assert (home / ".qwen" / "projects" / "notes.txt").exists()
    # claude: the previous account's settings.json (an apiKeyHelper, say) goes too
    claude = tmp_path / "claude"
    claude.mkdir()
    (claude / "settings.json").write_text('{"apiKeyHelper": "/previous/helper"}')
    import_bundle(pack(good()), "claude", claude)
    assert sorted(os.listdir(claude)) == [".claude.json", ".credentials.json"]


def _links(tmp_path: Path) -> list[tuple[str, Path]]:
    """Homes with a link somewhere on the way; each case: (what, home)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("untouched")
    cases = []
    real = tmp_path / "real-home"
    real.mkdir()
    home = tmp_path / "linked-home"
    home.symlink_to(real)
    cases.append(("the worker's home is a link", home))
    inner = tmp_path / "inner"
    (inner / "elsewhere").mkdir(parents=True)
    (inner / ".qwen").symlink_to(inner / "elsewhere")  # inside the home, still a link
    cases.append((".qwen/settings.json: .qwen", inner))
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / ".env").symlink_to(outside / "victim")  # a file the import would delete
    cases.append((".env: the home has a link", stale))
    return cases


def test_a_home_with_a_link_on_the_way_is_refused_and_nothing_is_touched(tmp_path: Path) -> None:
    data = _qwen_bundle({".qwen/settings.json": b"{}"})
    for message, home in _links(tmp_path):
        before = snapshot(tmp_path)
        with pytest.raises(BundleError, match="link") as info:
            import_bundle(data, "qwen", home)
        assert message in str(info.value), (message, str(info.value))
        assert snapshot(tmp_path) == before, message
    assert (tmp_path / "outside" / "victim").read_text() == "untouched"

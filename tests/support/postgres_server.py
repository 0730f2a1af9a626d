"""A throwaway PostgreSQL cluster on a free loopback port, for tests.

``initdb`` into a temporary directory, then ``postgres`` in the foreground
(its PID is ours to kill). PostgreSQL refuses to run as root: as root, the
cluster belongs to the ``postgres`` user Debian's package creates (the
process is started with that uid). Debian keeps the binaries in
``/usr/lib/postgresql/<version>/bin``, which is not always on PATH.
``kill()`` is SIGKILL (a crash), ``restart()`` brings the same cluster back
on the same port with its data.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from .ports import free_port

__all__ = ["PostgresServer", "require_postgres"]


def require_postgres() -> str:
    """The directory holding ``initdb`` and ``postgres``; skip (saying why) without one."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0)
    found = shutil.which("initdb")
    if found:
        candidates.append(os.path.dirname(os.path.realpath(found)))
    for directory in reversed(candidates):
        if os.access(os.path.join(directory, "initdb"), os.X_OK):
            return directory
    pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql; "
                "the Makefile's sysdeps target installs it)")


def _owner() -> pwd.struct_passwd | None:
    """Whom the cluster runs as: ``postgres`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")


class PostgresServer:
    def __init__(self) -> None:
        self.bin = require_postgres()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="poolgate-pg-")
        self.data = os.path.join(self.dir, "data")
        self.owner = _owner()
        if self.owner is not None:
            os.chown(self.dir, self.owner.pw_uid, self.owner.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None
        self._run([os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "postgres",
                   "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"])

    def _user(self) -> dict:
        if self.owner is None:
            return {}
        return {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, timeout=120, cwd=self.dir, **self._user())
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.decode(errors='replace')[-500:]}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        log = open(os.path.join(self.dir, "log"), "ab")
        self.proc = subprocess.Popen(
            [os.path.join(self.bin, "postgres"), "-D", self.data, "-p", str(self.port),
             "-k", self.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "full_page_writes=off"],  # fsync off: a process crash keeps the page cache
            stdout=log, stderr=log, cwd=self.dir, **self._user())
        log.close()
        deadline = time.monotonic() + 30
        while True:
            if self.ready():
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("postgres did not start: " + self.log_tail())
            time.sleep(0.05)

    def ready(self) -> bool:
        import psycopg

        try:
            psycopg.connect(self.url(), connect_timeout=1).close()
            return True
        except psycopg.OperationalError:
            return False

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "log"), "rb") as f:
                return f.read()[-1000:].decode(errors="replace")
        except OSError:
            return ""

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def create_role_and_database(self, user: str, password: str, database: str) -> str:
        """A login role owning a new database (as the postgres image makes them); its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(user), sql.Literal(password)))
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(user)))
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def kill(self) -> None:
        """SIGKILL the postmaster (a crash; its backends exit when they notice)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """A fast shutdown: clients are disconnected, the data stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

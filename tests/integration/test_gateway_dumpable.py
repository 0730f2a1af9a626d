"""The gateway makes itself non-dumpable at start: no other process of its
user reads ``/proc/<gateway>/environ`` (its admin token, upstream keys) or
attaches to it, which is what an agent-mode tool without a sandbox would do."""

from __future__ import annotations

import ctypes
import os
import sys
import time

import httpx
import pytest

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from pool.dumpable import is_dumpable, undumpable
from tests.support.server import ServerThread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")

_PR_SET_DUMPABLE = 4
NOBODY = 65534


def _set_dumpable(flag: int) -> None:
    assert ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, flag, 0, 0, 0) == 0


def test_the_gateway_turns_dumping_off_when_it_starts():
    _set_dumpable(1)  # as any fresh process is (another test's gateway may have run here)
    assert is_dumpable() is True
    settings = Settings(server=ServerSettings(admin_token="admin-token"), workers=(
        WorkerSettings(name="r", kind="remote", dialect="openai", url="http://127.0.0.1:9",
                       models=("m",)),))
    try:
        with ServerThread(create_app(settings)) as srv:
            assert httpx.get(srv.url + "/healthz").status_code == 200
            assert is_dumpable() is False
    finally:
        _set_dumpable(1)


def _fork(body) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:  # the child: plain syscalls only, then out without Python's cleanup
        code = 1
        try:
            code = body()
        finally:
            os._exit(code)
    return pid


def _as_other_user() -> None:
    if os.geteuid() == 0:  # root reads every /proc file: both sides become one plain user
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)


@pytest.mark.parametrize("dumpable", [True, False])
def test_a_process_of_the_same_user_reads_the_environment_only_of_a_dumpable_one(dumpable):
    read, write = os.pipe()

    def holder() -> int:
        _as_other_user()  # (a uid change clears the flag: set it as a fresh process has it)
        _set_dumpable(1)
        if not dumpable:
            undumpable()
        os.write(write, b"x")
        time.sleep(30)
        return 0

    target = _fork(holder)
    try:
        assert os.read(read, 1) == b"x"

        def reader() -> int:
            _as_other_user()
            try:
                with open(f"/proc/{target}/environ", "rb") as fh:
                    fh.read()
            except PermissionError:
                return 3
            return 0

        peer = _fork(reader)
        _, status = os.waitpid(peer, 0)
        assert os.waitstatus_to_exitcode(status) == (0 if dumpable else 3)
    finally:
        os.kill(target, 9)
        os.waitpid(target, 0)
        os.close(read)
        os.close(write)

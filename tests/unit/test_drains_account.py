"""A drain made on another replica reaches a cli worker through its account's
state machine (pool/cli/account.py), like an operator's drain on this one:
never while an action holds the account (a bundle import), and applied once
the account allows it."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from app.replicas import Drains
from pool.cli.account import Account, AccountState
from pool.worker import WorkerState
from sessions.shared import MemoryDrainedSet


class Worker:
    name = "acct"

    def __init__(self) -> None:
        self.process_state = WorkerState.STOPPED
        self.login: str | None = None
        self.cooldown_until = None
        self.in_flight = 0
        self.drained = False
        self.account: Account | None = None

    def info(self) -> dict[str, Any]:
        return {"login": self.login}

    def drain(self) -> None:
        self.drained = True

    def resume(self) -> None:
        self.drained = False


class Files:
    """A bundle import that holds the account until ``done`` is set."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.done = asyncio.Event()

    async def import_(self, data: bytes) -> Any:
        self.started.set()
        await self.done.wait()
        return "imported"

    async def export(self, info: Mapping[str, Any]) -> bytes:
        return b""


class Logins:
    def relogin_due(self, name: str) -> bool:
        return False


class Admission:
    def refresh(self) -> None:
        pass


class Pool:
    def __init__(self, *workers: Any) -> None:
        self.workers = list(workers)


class Gateway:
    runtime_workers = None

    def __init__(self, worker: Any) -> None:
        self.pool = Pool(worker)
        self.admission = Admission()

    def background(self, aw: Any) -> None:
        raise AssertionError("a fake worker's drain is not awaitable")


async def test_a_shared_drain_waits_for_the_account_and_is_applied_after() -> None:
    worker, files = Worker(), Files()
    worker.account = Account(worker, Logins(), files)  # type: ignore[arg-type]
    gw, shared = Gateway(worker), MemoryDrainedSet()
    drains = Drains(shared)
    importing = asyncio.ensure_future(worker.account.import_bundle(b"bundle"))
    await files.started.wait()
    assert worker.account.state is AccountState.IMPORTING

    await shared.add("acct")  # another replica's operator drains it
    await drains.sync(gw)
    assert not worker.drained, "a drain from another replica went around the account's import"
    assert "acct" not in drains.here  # not applied yet: the next sync tries again

    files.done.set()
    assert await importing == "imported"
    await drains.sync(gw)
    assert worker.drained and "acct" in drains.here

    await shared.discard("acct")  # resumed elsewhere: through the account too
    await drains.sync(gw)
    assert not worker.drained and "acct" not in drains.here

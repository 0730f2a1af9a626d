"""The account state machine (pool/cli/account.py) under random interleavings
of every action, against a fake worker, a fake login flow (a fake CLI login
process holding the real named lock and a port lock) and fake bundle files.

Invariants: never two actions at once on an account; a worker an operator
stopped is started again only by an operator; no login runs during an import
or export; every lock and every login process is gone at the end; whatever
is refused is refused with a 409 naming the state."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Mapping

from hypothesis import HealthCheck, example, given, settings, strategies as st

from pool.cli.account import ALLOWED, Account, AccountConflict, AccountState, Action
from pool.errors import Conflict
from pool.worker import WorkerState
from sessions.shared import MemoryLocks


class Violation(AssertionError):
    """An invariant broken (also kept in ``World.violations``: a login task's
    exception would otherwise end with the task)."""

    def __init__(self, world: World, message: str) -> None:
        super().__init__(message)
        world.violations.append(message)


class World:
    """What the fakes share, and the invariants they check as they go."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.active: set[str] = set()  # actions holding the account right now
        self.logins_running = 0
        self.files_active = 0
        self.processes: set[int] = set()
        self.locks = MemoryLocks()
        self.port = asyncio.Lock()
        self.pids = iter(range(1000, 10**6))
        self.violations: list[str] = []

    async def pause(self) -> None:
        for _ in range(self.rng.randrange(4)):
            await asyncio.sleep(0)

    def enter(self, what: str) -> None:
        if self.active:
            raise Violation(self, f"{what} while {self.active} runs")
        self.active.add(what)

    def leave(self, what: str) -> None:
        self.active.discard(what)


class FakeWorker:
    name = "acct"
    models = ("m",)

    def __init__(self, world: World) -> None:
        self.world = world
        self.process_state = WorkerState.READY
        self.login: str | None = world.rng.choice(["ready", "logged_out"])
        self.cooldown_until: float | None = None
        self.in_flight = 0
        self.stopped_by_operator = False

    def info(self) -> dict[str, Any]:
        return {"login": self.login}

    async def stop(self) -> None:
        self.world.enter("stop")
        try:
            await self.world.pause()
            self.process_state = WorkerState.STOPPED
            self.stopped_by_operator = True
        finally:
            self.world.leave("stop")

    async def restart(self, *, by: str = "operator") -> None:
        if self.stopped_by_operator and by != "operator":
            raise Violation(self.world, f"the {by} restarted a worker an operator stopped")
        if by == "operator":
            self.world.enter("restart")
        try:
            await self.world.pause()
            self.stopped_by_operator = False
            self.process_state = WorkerState.READY
        finally:
            if by == "operator":
                self.world.leave("restart")

    async def probe_login(self) -> None:
        self.world.enter("probe")
        try:
            await self.world.pause()
            self.login = self.world.rng.choice(["ready", "logged_out"])
        finally:
            self.world.leave("probe")


class FakeLogins:
    """The LoginFlow: a 'process' and two locks held while it runs, like app/logins.py."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.codes: dict[str, asyncio.Queue[str]] = {}
        self.records: dict[str, dict[str, Any]] = {}

    def prepare(self, name: str, auto: bool | None) -> dict[str, Any]:
        record = self.records[name] = {"state": "starting"}
        self.codes[name] = asyncio.Queue(maxsize=1)
        return record

    async def run(self, account: Account, record: dict[str, Any]) -> None:
        world = self.world
        if world.files_active:
            raise Violation(world, "a login during an import or export")
        async with world.locks.hold(f"login:{account.name}", ttl=60), world.port:
            pid = next(world.pids)
            world.processes.add(pid)
            world.logins_running += 1
            try:
                record["state"] = "waiting_for_code"
                for _ in range(world.rng.randrange(30)):
                    await world.pause()
                if world.rng.random() < 0.3:
                    await self.codes[account.name].get()
                record["state"] = "confirming"
                if world.files_active:
                    raise Violation(world, "a login during an import or export")
                await account.worker.restart(by="login")
                account.worker.login = "ready"
                record["state"] = "ready"
            finally:
                world.logins_running -= 1
                world.processes.discard(pid)

    def ended(self, record: Any, reason: str, message: str) -> None:
        record["state"] = reason

    async def answer(self, record: Any, stage: str) -> Any:
        await self.world.pause()
        return dict(record)

    def paste(self, name: str, code: str) -> Any:
        record = self.records.get(name)
        if record is None or record["state"] != "waiting_for_code" or self.codes[name].full():
            raise Conflict("not waiting for a code")
        self.codes[name].put_nowait(code)
        return record

    def relogin_due(self, name: str) -> bool:
        return self.world.rng.random() < 0.5


class FakeFiles:
    def __init__(self, world: World) -> None:
        self.world = world

    async def _use(self, what: str) -> None:
        world = self.world
        world.enter(what)
        if world.logins_running:
            raise Violation(world, f"{what} while a login runs")
        world.files_active += 1
        try:
            await world.pause()
        finally:
            world.files_active -= 1
            world.leave(what)

    async def import_(self, data: bytes) -> Any:
        await self._use("import")
        return {"files": 1}

    async def export(self, info: Mapping[str, Any]) -> bytes:
        await self._use("export")
        return b"bundle"


async def _drain_flag(world: World, what: str) -> None:
    world.enter(what)
    try:
        await world.pause()
    finally:
        world.leave(what)


def _call(account: Account, world: World, action: str) -> Any:
    return {
        "login": lambda: account.login(False),
        "auto_login": lambda: account.login(True, automatic=True),
        "login_code": lambda: account.login_code("code"),
        "cancel_login": account.cancel_login,
        "probe": account.probe,
        "stop": account.stop,
        "restart": account.restart,
        "drain": lambda: account.drain(lambda: _drain_flag(world, "drain")),
        "resume": lambda: account.resume(lambda: _drain_flag(world, "resume")),
        "import": lambda: account.import_bundle(b"x"),
        "export": account.export_bundle,
        "tick": account.tick,
        "logged_out": lambda: _log_out(account),
    }[action]()


async def _log_out(account: Account) -> None:
    """The CLI found its account refused (what the child reports, any time)."""
    account.worker.login = "logged_out"


ACTIONS = [a.value for a in Action] + ["tick", "logged_out"]


async def _scenario(steps: list[tuple[str, int]], seed: int, login_timeout: float) -> None:
    world = World(random.Random(seed))
    worker = FakeWorker(world)
    account = Account(worker, FakeLogins(world), FakeFiles(world), login_timeout=login_timeout,
                      probe_interval=0.0)
    if world.rng.random() < 0.3:
        await account.stop()
    refused: list[AccountConflict] = []

    async def one(action: str, wait: int) -> None:
        for _ in range(wait):
            await asyncio.sleep(0)
        try:
            await _call(account, world, action)
        except AccountConflict as exc:
            assert exc.status == 409 and exc.state.value in str(exc)
            refused.append(exc)
            return
        except Conflict:
            assert action == "login_code"  # the login waits for no code (yet, or any more)
            return
        if action == "stop":  # stopped, and nothing ran in between
            assert account.state is AccountState.STOPPED
            assert worker.process_state is WorkerState.STOPPED

    await asyncio.gather(*(one(action, wait) for action, wait in steps))
    # a login still running ends at its deadline, or with the gateway
    await account.aclose()
    assert not world.violations, world.violations
    assert not world.active and world.logins_running == 0
    assert not world.processes, "a login process outlived its login"
    assert not world.locks.held(f"login:{account.name}") and not world.port.locked()
    if worker.stopped_by_operator:
        assert account.state is AccountState.STOPPED
        assert worker.process_state is WorkerState.STOPPED
    for exc in refused:
        assert exc.state not in ALLOWED[exc.action]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 12)), max_size=14),
       seed=st.integers(0, 2**32), login_timeout=st.sampled_from([0.001, 0.05, 60.0]))
@example(steps=[("login", 0), ("stop", 3)], seed=4, login_timeout=60.0)  # stop mid-login
def test_random_interleavings_keep_the_invariants(steps: list[tuple[str, int]], seed: int,
                                                  login_timeout: float) -> None:
    asyncio.run(_scenario(steps, seed, login_timeout))


def test_every_state_and_action_is_in_the_table() -> None:
    assert set(ALLOWED) == set(Action)
    for action, states in ALLOWED.items():
        assert states <= set(AccountState), action
    # nothing logs in while files are written or read, or after an operator's stop
    for busy in (AccountState.IMPORTING, AccountState.EXPORTING, AccountState.STOPPED):
        assert busy not in ALLOWED[Action.LOGIN] | ALLOWED[Action.AUTO_LOGIN]
    assert ALLOWED[Action.IMPORT] == {AccountState.STOPPED}

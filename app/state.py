"""The gateway's persistent state while it runs: the SQLite file in
``server.state_dir`` (memory only without one) with the usage ledger and the
run-time keys, loaded into the key ring and the policies at start-up."""

from __future__ import annotations

import calendar
import contextlib
import time
from typing import Any

import structlog

from auth.limits import KeyPolicy
from sessions.keystore import KeyStore
from sessions.ledger import MEMORY_MAX_ROWS, StateDB, UsageLedger

from .gateway import Gateway
from .teams import policy_from_mapping

__all__ = ["open_state", "apply_policy", "day_start", "month_start", "budget_totals",
           "rebuild_budgets"]

log = structlog.get_logger("poolgate.state")


def day_start(now: float) -> float:
    """The start of the UTC day of ``now`` (Unix seconds)."""
    return float(int(now // 86400) * 86400)


def month_start(now: float) -> float:
    t = time.gmtime(now)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def apply_policy(gw: Gateway, policy: KeyPolicy) -> None:
    """Make ``policy`` the key's policy on the request path."""
    gw.teams.set_policy(policy)
    gw.admission.set_key_limit(policy.name, policy.max_in_flight)


async def open_state(gw: Gateway, state_dir: str | None,
                     stack: contextlib.AsyncExitStack) -> None:
    """Open the state file, start the ledger's writer, load the run-time keys
    and start today's and this month's budgets at what the ledger has."""
    db = StateDB(state_dir)
    stack.callback(db.close)
    # in memory nothing else bounds it: the newest MEMORY_MAX_ROWS requests
    gw.ledger = UsageLedger(db, max_rows=MEMORY_MAX_ROWS if state_dir is None else None)
    stack.callback(gw.ledger.close)
    gw.keystore = KeyStore(db)
    stored = gw.keystore.all()
    for key in stored:
        if key.name in gw.config_keys:
            log.warning("state.key_shadowed", key=key.name)  # the configuration wins
            continue
        gw.keyring.add(key.name, key.digest)
        apply_policy(gw, policy_from_mapping(key.name, key.policy))
    if stored:
        gw.keyring.require()
    await rebuild_budgets(gw)
    log.info("state.opened", path=db.path, runtime_keys=len(stored))


async def budget_totals(gw: Gateway) -> dict[str, tuple[int, int]]:
    """Every budgeted key's tokens today and this month (UTC), as the usage
    ledger has them: the truth budgets are rebuilt from. The one place that
    reads the ledger for budgets (a shared database answers for every replica;
    one SQLite per replica, for this replica's requests only)."""
    budgeted = [p.name for p in gw.teams.policies.values()
                if p.budget_day is not None or p.budget_month is not None]
    if not budgeted:
        return {}
    today: dict[str, tuple[int, int, int]] = {}
    month: dict[str, tuple[int, int, int]] = {}
    if gw.ledger is not None:
        now = time.time()
        today = gw.ledger.tokens_by_key(day_start(now))
        month = gw.ledger.tokens_by_key(month_start(now))
    totals = {}
    for name in budgeted:
        _, day_in, day_out = today.get(name, (0, 0, 0))
        _, month_in, month_out = month.get(name, (0, 0, 0))
        totals[name] = (day_in + day_out, month_in + month_out)
    return totals


async def rebuild_budgets(gw: Gateway) -> None:
    """Start (or restart, after Redis lost them) the budgets at the ledger's totals."""
    totals = await budget_totals(gw)
    await gw.teams.limits.rebuild(totals)
    if totals:
        log.info("state.budgets_seeded", keys=len(totals))

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

__all__ = ["open_state", "apply_policy", "day_start", "month_start"]

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
    now = time.time()
    budgeted = [p.name for p in gw.teams.policies.values()
                if p.budget_day is not None or p.budget_month is not None]
    if budgeted:
        today = gw.ledger.tokens_by_key(day_start(now))
        month = gw.ledger.tokens_by_key(month_start(now))
        for name in budgeted:
            _, day_in, day_out = today.get(name, (0, 0, 0))
            _, month_in, month_out = month.get(name, (0, 0, 0))
            await gw.teams.limits.seed(name, day_in + day_out, month_in + month_out)
    log.info("state.opened", path=db.path, runtime_keys=len(stored))

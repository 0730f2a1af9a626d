"""The gateway's persistent state while it runs: the database of
``server.database_url`` (default: the SQLite file in ``server.state_dir``,
memory only without one) with the usage ledger and the run-time keys,
loaded into the key ring and the policies at start-up and kept in step with
the other replicas' changes (:mod:`app.key_sync`)."""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import time
from typing import Iterable

import structlog

from sessions.database import sqlite_url
from sessions.keystore import KeyStore
from sessions.ledger import MEMORY_MAX_ROWS, UsageLedger, open_state_db

from .gateway import Gateway
from .key_sync import apply_policy, follow_key_changes, sync_keys

__all__ = ["open_state", "apply_policy", "day_start", "month_start", "seed_budgets",
           "budget_totals", "rebuild_budgets"]

log = structlog.get_logger("poolgate.state")


def day_start(now: float) -> float:
    """The start of the UTC day of ``now`` (Unix seconds)."""
    return float(int(now // 86400) * 86400)


def month_start(now: float) -> float:
    t = time.gmtime(now)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def budget_totals(gw: Gateway, now: float) -> dict[str, tuple[int, int]]:
    """Key name -> (today's, this month's) input + output tokens in the database,
    for every key with a budget. Totals are the ledger's rows of the key's id
    (a new key with an old name starts at zero). Blocking: call in a thread."""
    if gw.ledger is None:
        return {}
    today = gw.ledger.tokens_by_key(day_start(now))
    month = gw.ledger.tokens_by_key(month_start(now))
    out = {}
    for policy in list(gw.teams.policies.values()):  # a copy: the loop may change it meanwhile
        if policy.budget_day is None and policy.budget_month is None:
            continue
        key_id = gw.keyring.id_of(policy.name)
        _, day_in, day_out = today.get(key_id, (0, 0, 0))
        _, month_in, month_out = month.get(key_id, (0, 0, 0))
        out[policy.name] = (day_in + day_out, month_in + month_out)
    return out


async def seed_budgets(gw: Gateway, names: Iterable[str] | None = None) -> None:
    """Start the budgets (all, or those of ``names``) at the database's totals."""
    totals = await asyncio.to_thread(budget_totals, gw, time.time())
    wanted = None if names is None else set(names)
    for name, (day, month) in totals.items():
        if wanted is None or name in wanted:
            await gw.teams.limits.seed(name, day, month)


async def open_state(gw: Gateway, state_dir: str | None, stack: contextlib.AsyncExitStack,
                     database_url: str | None = None, *, key_poll: float | None = 0.5) -> None:
    """Open (and migrate) the database, start the ledger's writer, load the
    run-time keys, start today's and this month's budgets at what the ledger
    has, and follow other replicas' key changes every ``key_poll`` seconds."""
    url = database_url or sqlite_url(state_dir)
    db = await asyncio.to_thread(open_state_db, url)
    stack.callback(db.close)
    memory = url == "sqlite://"
    # in memory nothing else bounds it: the newest MEMORY_MAX_ROWS requests
    gw.ledger = UsageLedger(db, max_rows=MEMORY_MAX_ROWS if memory else None,
                            spill_dir=state_dir)
    stack.callback(gw.ledger.close)
    gw.keystore = KeyStore(db)
    await sync_keys(gw)
    await rebuild_budgets(gw)
    if key_poll is not None:
        task = asyncio.ensure_future(follow_key_changes(gw, key_poll))
        stack.callback(task.cancel)
    log.info("state.opened", where=db.where,
             runtime_keys=len([n for n in gw.keyring.names if n not in gw.config_keys]))


async def rebuild_budgets(gw: Gateway) -> None:
    """Start (or restart, after Redis lost them) the budgets at the database's
    totals: the truth budgets are rebuilt from (a shared database answers for
    every replica; one SQLite per replica, for this replica's requests only)."""
    totals = await asyncio.to_thread(budget_totals, gw, time.time())
    await gw.teams.limits.rebuild(totals)
    if totals:
        log.info("state.budgets_seeded", keys=len(totals))

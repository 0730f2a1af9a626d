"""The gateway's persistent state while it runs: the database of
``server.database_url`` (default: the SQLite file in ``server.state_dir``,
memory only without one) with the usage ledger and the run-time keys,
loaded into the key ring and the policies at start-up and kept in step with
the other replicas' changes (:mod:`app.key_sync`)."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from sessions.database import sqlite_url
from sessions.keystore import KeyStore
from sessions.ledger import MEMORY_MAX_ROWS, UsageLedger, open_state_db

from .budgets import budget_totals, day_start, month_start, rebuild_budgets, seed_budgets
from .gateway import Gateway
from .key_sync import apply_policy, follow_key_changes, sync_keys

__all__ = ["open_state", "apply_policy", "day_start", "month_start", "seed_budgets",
           "budget_totals", "rebuild_budgets"]

log = structlog.get_logger("poolgate.state")


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

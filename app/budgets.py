"""Token budgets start at the database's totals: at start-up, after Redis
lost its counters, and when a key gets a budget it did not have (a ``PATCH``
here or on another replica). The ledger counts every answer of a key's id,
budget or not, so a budget added later counts what the key already used."""

from __future__ import annotations

import asyncio
import calendar
import time
from typing import Iterable

import structlog

from auth.limits import KeyPolicy

from .gateway import Gateway

__all__ = ["day_start", "month_start", "budget_totals", "seed_budgets", "rebuild_budgets",
           "budget_changed"]

log = structlog.get_logger("poolgate.state")


def day_start(now: float) -> float:
    """The start of the UTC day of ``now`` (Unix seconds)."""
    return float(int(now // 86400) * 86400)


def month_start(now: float) -> float:
    t = time.gmtime(now)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def budget_changed(old: KeyPolicy | None, new: KeyPolicy) -> bool:
    """Whether ``new`` has a budget that ``old`` (the policy in force) did not have as is."""
    budget = (new.budget_day, new.budget_month)
    if budget == (None, None):
        return False
    return old is None or (old.budget_day, old.budget_month) != budget


def budget_totals(gw: Gateway, now: float,
                  policies: Iterable[KeyPolicy] | None = None) -> dict[str, tuple[int, int]]:
    """Key name -> (today's, this month's) input + output tokens in the database,
    for every key with a budget (of ``policies``, default the policies in force).
    Totals are the ledger's rows of the key's id (a new key with an old name
    starts at zero). Blocking: call in a thread."""
    if gw.ledger is None:
        return {}
    today = gw.ledger.tokens_by_key(day_start(now))
    month = gw.ledger.tokens_by_key(month_start(now))
    out = {}
    # a copy: the loop may change the policies meanwhile
    for policy in list(gw.teams.policies.values() if policies is None else policies):
        if policy.budget_day is None and policy.budget_month is None:
            continue
        key_id = gw.keyring.id_of(policy.name)
        _, day_in, day_out = today.get(key_id, (0, 0, 0))
        _, month_in, month_out = month.get(key_id, (0, 0, 0))
        out[policy.name] = (day_in + day_out, month_in + month_out)
    return out


async def seed_budgets(gw: Gateway, policies: Iterable[KeyPolicy]) -> None:
    """Start the budgets of ``policies`` (about to be in force) at the
    database's totals; :class:`~sessions.database.DatabaseUnavailable` when
    it does not answer."""
    wanted = list(policies)
    if not wanted:
        return
    totals = await asyncio.to_thread(budget_totals, gw, time.time(), wanted)
    for name, (day, month) in totals.items():
        await gw.teams.limits.seed(name, day, month)


async def rebuild_budgets(gw: Gateway) -> None:
    """Start (or restart, after Redis lost them) the budgets at the database's
    totals: the truth budgets are rebuilt from (a shared database answers for
    every replica; one SQLite per replica, for this replica's requests only)."""
    totals = await asyncio.to_thread(budget_totals, gw, time.time())
    await gw.teams.limits.rebuild(totals)
    if totals:
        log.info("state.budgets_seeded", keys=len(totals))

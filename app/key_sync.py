"""Run-time keys kept in step with the database, on every replica.

Each key change bumps ``key_version`` in the same transaction
(:class:`~sessions.keystore.KeyStore`). Every replica polls that one number
(``key_poll`` seconds, 0.5 by default: a one-row read) and, when it moved,
reloads the keys and applies the difference: a key gone (or replaced by
another key of the same name, with another id) is refused from then on and
forgets its windows and stored responses; a new one is accepted; a changed
policy applies to the next request (a budget it did not have starts at the
ledger's totals of the key, :mod:`app.budgets`). A revocation on one replica thus holds
on all within ``key_poll`` plus one read.

While the database does not answer, the keys last read stay in force (a
gateway keeps serving through a database outage) and the poll retries.
"""

from __future__ import annotations

import asyncio

import structlog

from auth.limits import KeyPolicy
from sessions.database import DatabaseUnavailable
from sessions.keystore import StoredKey

from .budgets import budget_changed, seed_budgets
from .gateway import Gateway
from .teams import policy_from_mapping

__all__ = ["apply_policy", "adopt_policies", "sync_keys", "follow_key_changes", "forget_key"]

log = structlog.get_logger("poolgate.state")


def apply_policy(gw: Gateway, policy: KeyPolicy) -> None:
    """Make ``policy`` the key's policy on the request path."""
    gw.teams.set_policy(policy)
    # in flight is counted by the key's id (see Gateway.admit); windows by its name
    gw.admission.set_key_limit(gw.keyring.id_of(policy.name), policy.max_in_flight)


async def adopt_policies(gw: Gateway, policies: list[KeyPolicy]) -> None:
    """Put ``policies`` in force; a budget new to its key first starts at
    what the ledger has of the key (one read for all of them; a
    :class:`DatabaseUnavailable` leaves every policy as it was)."""
    current = gw.teams.policies
    await seed_budgets(gw, [p for p in policies if budget_changed(current.get(p.name), p)])
    for policy in policies:
        apply_policy(gw, policy)


async def forget_key(gw: Gateway, name: str, key_id: str) -> None:
    """``name`` is refused from now on; its windows and stored responses go."""
    gw.keyring.remove(name)  # first: refused from this moment
    await gw.teams.drop(name)
    gw.admission.set_key_limit(key_id, None)
    try:
        deleted = await gw.responses.delete_owner(key_id)
    except Exception as exc:  # Redis away: the entries stay unreadable (no key owns them)
        log.warning("state.key_responses_kept", key=name, error=type(exc).__name__)
    else:
        if deleted:
            log.info("state.key_responses_deleted", key=name, responses=deleted)


def _accept(gw: Gateway, key: StoredKey) -> KeyPolicy | None:
    """Accept ``key`` (or its new secret); its policy when that is not the current one."""
    if gw.keyring.digest_of(key.name) != key.digest or gw.keyring.id_of(key.name) != key.id:
        gw.keyring.add(key.name, key.digest, key.id)
    policy = policy_from_mapping(key.name, key.policy)
    return policy if gw.teams.policies.get(key.name) != policy else None


async def sync_keys(gw: Gateway) -> bool:
    """Load the run-time keys if ``key_version`` moved since the last load; True if it did."""
    store = gw.keystore
    assert store is not None
    version = await asyncio.to_thread(store.version)
    if version == gw.key_version:
        return False
    stored = await asyncio.to_thread(store.all)
    current: dict[str, StoredKey] = {}
    for key in stored:
        if key.name in gw.config_keys:
            if gw.key_version < 0:
                log.warning("state.key_shadowed", key=key.name)  # the configuration wins
            continue
        current[key.name] = key
    for name in gw.keyring.names:
        if name in gw.config_keys:
            continue
        key = current.get(name)
        if key is None or key.id != gw.keyring.id_of(name):
            await forget_key(gw, name, gw.keyring.id_of(name))
            log.info("state.key_revoked", key=name)
    changed = [p for p in (_accept(gw, key) for key in current.values()) if p is not None]
    if gw.key_version < 0:  # the first load: open_state seeds every budget next, in one batch
        for policy in changed:
            apply_policy(gw, policy)
    elif changed:
        await adopt_policies(gw, changed)
    if stored or version > 0:
        # a key was made once (maybe on another replica, maybe deleted since):
        # deleting every key must not open the gateway
        gw.keyring.require()
    gw.key_version = version
    return True


async def follow_key_changes(gw: Gateway, interval: float) -> None:
    """Poll ``key_version`` every ``interval`` seconds, for ever (cancel to stop)."""
    down = False
    while True:
        await asyncio.sleep(interval)
        try:
            await sync_keys(gw)
        except DatabaseUnavailable as exc:
            if not down:
                log.warning("state.keys_unreadable", error=str(exc))
            down = True
            continue
        except Exception:
            log.exception("state.key_sync_failed")
            continue
        if down:
            log.info("state.keys_readable")
            down = False

"""``sessions.alert_claims``: against a real Redis, one of two replicas' links
claims a shared alert, once, and the claim expires; with Redis out of reach
every claim is granted (an alert sent twice beats one sent by none)."""

from __future__ import annotations

import asyncio

from sessions.alert_claims import RedisAlertClaims
from sessions.redis_link import RedisLink
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer


async def test_one_replica_claims_an_alert_and_the_claim_expires() -> None:
    server = RedisServer().start()
    links = [RedisLink(server.url, timeout=2.0) for _ in range(2)]
    try:
        assert all([await link.ping() for link in links])
        a, b = (RedisAlertClaims(link, ttl=0.5) for link in links)
        won = await asyncio.gather(*(c.claim("hook:key_over_budget:team:budget_day:1")
                                     for c in (a, b, a, b)))
        assert sorted(won) == [False, False, False, True]
        assert await a.claim("hook:key_over_budget:team:budget_day:2")  # the next window
        await asyncio.sleep(0.7)
        assert await b.claim("hook:key_over_budget:team:budget_day:1")  # expired
    finally:
        for link in links:
            await link.aclose()
        server.stop()


async def test_without_redis_every_claim_is_granted() -> None:
    link = RedisLink(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    try:
        assert not await link.ping()
        claims = RedisAlertClaims(link)
        assert await claims.claim("t") and await claims.claim("t")
    finally:
        await link.aclose()

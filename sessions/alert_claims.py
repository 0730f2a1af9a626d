"""Which replica sends an alert that concerns state every replica shares (a
key's budget window, counted in Redis): the first to claim it.

Each replica notices a budget alert on its own (the key's requests come to
all of them), so each would send it; :meth:`RedisAlertClaims.claim` is a
``SET NX`` on one key per receiver, event, subject and window, and only the
replica that set it sends. The key outlives the longest budget window (a
month), then expires. While Redis is down every claim is granted: an alert
sent by two replicas beats one sent by none.
"""

from __future__ import annotations

import structlog

from .redis_link import RedisDown, RedisLink

__all__ = ["RedisAlertClaims", "CLAIM_TTL"]

log = structlog.get_logger("poolgate.redis")

#: a claim outlives the longest window an alert is once per (a month's budget, and more)
CLAIM_TTL = 40 * 86400.0


class RedisAlertClaims:
    def __init__(self, link: RedisLink, ttl: float = CLAIM_TTL) -> None:
        self._link = link
        self._key = link.prefix + "alert-once:"
        self._ttl_ms = int(ttl * 1000)

    async def claim(self, token: str) -> bool:
        """Whether this replica is the first to claim ``token`` (it sends the alert)."""
        client, key, ttl = self._link.client, self._key + token, self._ttl_ms
        try:
            return bool(await self._link.call(lambda: client.set(key, 1, nx=True, px=ttl)))
        except RedisDown:
            log.warning("alerts.claim_unavailable")
            return True

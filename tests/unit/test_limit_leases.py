"""A replica's lease on a key's shared window: its size within the bounds
the docs promise, and when it may be used (sans-IO, replies built as the
limit script returns them)."""

from __future__ import annotations

import pytest

from auth.limits import KeyPolicy
from sessions.limit_leases import LIFETIME, MAX_SIZE, SHARE, Lease

T0 = 1_795_000_000.0
DAY = int(T0 // 86400)


def reply(window: float = T0, requests: int = 0, tokens: int = 0, granted: int = 0,
          refused: str = "") -> list:
    return [refused, repr(window), requests, tokens, DAY, tokens, tokens, granted]


def busy_lease(policy: KeyPolicy, rate: float, tokens_seen: int = 0) -> Lease:
    """A lease that has seen ``rate`` admissions per second over the last second."""
    lease = Lease(policy, T0)
    lease.counted = int(rate)
    lease.seen_requests = max(1, int(rate))
    lease.seen_tokens = tokens_seen
    return lease


@pytest.mark.parametrize("policy, rate, tokens_seen, used, expected", [
    (KeyPolicy("k", rpm=10**9), 0, 0, 0, 1),                  # nothing seen yet: one request
    (KeyPolicy("k", rpm=10**9), 100, 0, 0, 50),               # half a second of traffic
    (KeyPolicy("k", rpm=10**9), 10_000, 0, 0, MAX_SIZE),      # capped
    (KeyPolicy("k", rpm=1600), 10_000, 0, 0, 1600 // SHARE),  # 1/16 of what is left
    (KeyPolicy("k", rpm=1600), 10_000, 0, 1590, 1),           # near the limit: no lease
    (KeyPolicy("k", tpm=10**9), 10_000, 0, 0, 1),             # tokens per request unknown
    # 10 tokens a request, 16_000 tokens left: 100 requests would use 1/16 of them
    (KeyPolicy("k", tpm=16_000), 10_000, 100_000, 0, 100),
    (KeyPolicy("k", budget_day=8_000 + 8_000), 10_000, 100_000, 8_000, 50),
])
def test_lease_size(policy: KeyPolicy, rate: float, tokens_seen: int, used: int,
                    expected: int) -> None:
    lease = busy_lease(policy, rate, tokens_seen)
    lease.requests = used if policy.rpm is not None else 0
    lease.tokens = lease.day_tokens = lease.month_tokens = used if policy.rpm is None else 0
    assert lease.want(policy, T0 + 1) == expected


def test_take_uses_the_lease_only_while_it_holds() -> None:
    policy = KeyPolicy("k", rpm=1000, tpm=500)
    lease = Lease(policy, T0)
    assert not lease.take(policy, T0, 60)                     # nothing leased yet
    lease.granted(policy, reply(granted=2, tokens=100), T0)
    assert lease.take(policy, T0 + 0.1, 60)
    assert not lease.take(KeyPolicy("k", rpm=1000, tpm=500), T0 + 0.1, 60)  # another policy
    assert not lease.take(policy, T0 + LIFETIME, 60)          # expired
    assert lease.take(policy, T0 + 0.2, 60) and lease.left == 0
    lease.granted(policy, reply(granted=5, tokens=100), T0 + 0.3)
    lease.charged(400)                                        # this replica's answers: at tpm
    assert not lease.take(policy, T0 + 0.4, 60) and lease.left == 5


def test_a_new_window_voids_the_old_lease() -> None:
    policy = KeyPolicy("k", rpm=1000)
    lease = Lease(policy, T0)
    lease.granted(policy, reply(granted=10), T0)
    assert not lease.take(policy, T0 + 60, 60)                # the window it was leased in closed
    lease.granted(policy, reply(window=T0 + 60, granted=3), T0 + 60)
    assert lease.left == 3 and lease.window_start == T0 + 60
    lease.granted(policy, reply(window=T0 + 60, granted=0, refused="requests"), T0 + 60.1)
    assert lease.left == 3 and lease.refused is not None


def test_stale_at_half_used_or_half_its_lifetime() -> None:
    policy = KeyPolicy("k", rpm=10**6)
    lease = Lease(policy, T0)
    lease.granted(policy, reply(granted=10), T0)
    assert not lease.stale(T0)
    for _ in range(5):
        assert lease.take(policy, T0, 60)
    assert lease.stale(T0)
    lease.granted(policy, reply(granted=10), T0)
    assert not lease.stale(T0 + LIFETIME / 2 - 0.01) and lease.stale(T0 + LIFETIME / 2)

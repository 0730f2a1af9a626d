"""Shared in-flight slots against a real redis-server: two links stand for two
replicas; a flushed Redis gets the counts back, a cancelled take leaks nothing."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from sessions.redis_link import RedisLink
from sessions.redis_slots import LIFETIME, RedisSlots
from tests.support.redis_fixtures import server  # noqa: F401 (a pytest fixture)
from tests.support.redis_server import RedisServer


@pytest.fixture
async def pair(server: RedisServer) -> AsyncIterator[tuple[RedisSlots, RedisSlots]]:
    links = [RedisLink(server.url, timeout=0.5) for _ in range(2)]
    for link in links:
        assert await link.ping()
    try:
        yield RedisSlots(links[0], "a", batch=0.01), RedisSlots(links[1], "b", batch=0.01)
    finally:
        for link in links:
            await link.aclose()


async def _settled() -> None:
    await asyncio.sleep(0.05)  # give-backs are sent batch seconds later


async def test_the_limit_counts_both_replicas_and_give_backs_free_it(pair) -> None:
    a, b = pair
    assert await a.take("k", 2) and await b.take("k", 2)
    assert not await a.take("k", 2) and not await b.take("k", 2)
    b.give_back("k")
    b.give_back("k")  # one more than held: ignored, never below zero
    await _settled()
    assert await a.take("k", 2)
    assert not await b.take("k", 2)


async def test_a_flushed_redis_gets_the_counts_back(pair, server: RedisServer) -> None:
    a, b = pair
    assert await a.take("k", 2) and await a.take("k", 2)
    client = server.client()
    try:
        client.flushall()
    finally:
        client.close()
    await a.beat(republish=True)
    assert not await b.take("k", 2), "the two slots held on A were forgotten"
    a.give_back("k")
    await _settled()
    assert await b.take("k", 2)


async def test_a_cancelled_take_gives_its_slot_back(pair) -> None:
    a, b = pair
    task = asyncio.ensure_future(a.take("k", 1))
    await asyncio.sleep(0)  # sent, not answered yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.1)
    assert await b.take("k", 1), "a cancelled take kept its slot"


async def test_spares_spare_round_trips_never_exceed_the_limit_and_go_back(pair) -> None:
    a, b = pair
    limit = 64
    for _ in range(16):
        assert await a.take("busy", limit)
    assert a.stats()["round_trips"] <= 8 and a.stats()["spares"] >= 8, a.stats()
    taken_b = 0
    while await b.take("busy", limit):
        taken_b += 1
    # together never over the limit; early by at most A's spares
    assert 16 + taken_b <= limit
    assert 16 + taken_b >= limit - a.stats()["reserved"] + 16
    for _ in range(16):
        a.give_back("busy")
    await asyncio.sleep(2 * LIFETIME + 0.3)  # A's idle spares go back (swept every LIFETIME)
    assert a.stats()["reserved"] == 0
    while await b.take("busy", limit):
        taken_b += 1
    assert taken_b == limit


async def test_a_slot_that_ends_goes_to_the_request_waiting_here(pair) -> None:
    a, b = pair
    assert await a.take("k", 1)
    assert not await a.take("k", 1)
    waiting = asyncio.ensure_future(a.wait("k", 5))
    await asyncio.sleep(0.01)
    a.give_back("k")  # handed over: no round trip, still counted in Redis
    assert await waiting and a.stats()["handoffs"] == 1
    await _settled()
    assert not await b.take("k", 1), "the handed-over slot was given back to Redis"
    assert not await a.wait("k", 0.05)  # nobody hands one over: a timeout, not a slot
    a.give_back("k")
    await _settled()
    assert await b.take("k", 1)

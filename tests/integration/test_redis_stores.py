"""The Redis stores against a real redis-server: two links stand for two replicas.

Rate-limit leases (the last tests): a busy key is admitted mostly without a
round trip, yet its rpm holds exactly across replicas, an idle lease goes
back, and tokens charged on another replica stop a lease within its lifetime."""

from __future__ import annotations

import asyncio
import time

import pytest

from auth.limits import KeyPolicy, MemoryLimits
from sessions.limit_leases import LIFETIME
from sessions.redis_bindings import RedisBindingStore, RedisUpstreamSessions
from sessions.redis_limits import RedisLimits
from sessions.redis_link import RedisLink, StoreUnavailable
from sessions.redis_responses import RedisResponseStore
from sessions.responses import BrokenChain, StoredResponse, dumps, load_chain
from sessions.shared import LockTimeout, RedisDrainedSet, RedisLocks
from tests.support.redis_fixtures import links, server  # noqa: F401 (pytest fixtures)
from tests.support.redis_server import RedisServer


def entry(rid: str, owner: str = "team-a", previous: str | None = None,
          text: str = "x") -> StoredResponse:
    return StoredResponse(id=rid, response={"id": rid, "output": [{"text": text}]},
                          input_items=({"id": f"in-{rid}", "content": text},),
                          previous_id=previous, worker="w1", created_at=time.time(), owner=owner)


async def test_bindings_shared_with_sliding_ttl_and_compare_and_set(links) -> None:
    a, b = (RedisBindingStore(link, ttl=0.4, fresh=0) for link in links)  # every read to Redis
    assert await a.claim("s", None, "w1") == "w1"
    assert await b.claim("s", None, "w2") == "w1"   # the first claim won
    assert await b.get("s") == "w1"
    assert await b.claim("s", "w1", "w2") == "w2"   # moved from the expected owner
    assert await a.claim("s", "w1", "w3") == "w2"   # a stale expectation loses
    for _ in range(3):                              # reads slide the time to live
        await asyncio.sleep(0.2)
        assert await a.get("s") == "w2"
    await asyncio.sleep(0.6)
    assert await b.get("s") is None
    await a.set("t", "w1")
    await b.delete("t")
    assert await a.get("t") is None


async def test_concurrent_first_claims_agree(server: RedisServer) -> None:
    # about atomicity, not timing: 40 new connections at once may take longer
    # than the default 100 ms on a busy machine (and then fall back to local claims)
    links = [RedisLink(server.url, timeout=2.0) for _ in range(2)]
    try:
        for link in links:
            assert await link.ping()
        a, b = (RedisBindingStore(link) for link in links)
        held = await asyncio.gather(*(store.claim(f"k{i}", None, f"w-{n}")
                                      for i in range(20) for n, store in enumerate((a, b))))
        for i in range(20):
            assert held[2 * i] == held[2 * i + 1]
        assert all(link.up for link in links)
    finally:
        for link in links:
            await link.aclose()


async def test_responses_chain_read_and_delete_across_links(links) -> None:
    a, b = (RedisResponseStore(link) for link in links)
    await a.put(entry("r1"))
    await a.put(entry("r2", previous="r1"))
    await b.put(entry("r3", previous="r2"))
    chain = await load_chain(b, "r3", "team-a")
    assert [c.id for c in chain] == ["r1", "r2", "r3"]
    assert chain[0].input_items[0]["content"] == "x"
    assert await load_chain(b, "r3", "team-b") is None          # another key's: not found
    assert await b.delete("r2") and not await a.delete("r2")
    with pytest.raises(BrokenChain) as broken:
        await load_chain(a, "r3", "team-a")
    assert broken.value.missing == "r2"


async def test_response_bounds_evict_the_biggest_owner_first(links) -> None:
    a, b = (RedisResponseStore(link, max_items=4) for link in links)
    for i in range(3):
        await a.put(entry(f"big{i}", owner="big"))
    await b.put(entry("small0", owner="small"))
    await b.put(entry("small1", owner="small"))   # over the count: big's oldest goes
    assert await a.get("big0") is None
    assert await a.get("big1") is not None and await a.get("small0") is not None
    assert b.stats()["evicted"] == 1


async def test_a_deleted_keys_responses_go_in_one_call(links) -> None:
    a, b = (RedisResponseStore(link, max_items=4) for link in links)
    for i in range(3):
        await a.put(entry(f"gone{i}", owner="key:old"))
    await b.put(entry("kept", owner="key:other"))
    assert await b.delete_owner("key:old") == 3
    assert all([await a.get(f"gone{i}") is None for i in range(3)])
    assert await a.get("kept") is not None and await a.delete_owner("key:old") == 0
    for i in range(3):  # the bookkeeping went too: the bound is not reached by ghosts
        await a.put(entry(f"new{i}", owner="key:new"))
    assert a.stats()["evicted"] == 0 and await a.get("kept") is not None


async def test_response_byte_bound_and_age(links) -> None:
    size = len(dumps(entry("r0")))
    store = RedisResponseStore(links[0], max_bytes=size * 2 + size // 2, max_age=0.3)
    for i in range(3):
        await store.put(entry(f"r{i}"))
    assert await store.get("r0") is None and await store.get("r2") is not None
    await store.put(entry("huge", text="y" * size * 3))
    assert await store.get("huge") is None and store.stats()["rejected"] == 1
    await asyncio.sleep(0.4)
    assert await store.get("r2") is None      # past max_age: Redis expired it
    await store.put(entry("fresh"))           # reaps the owner's expired bookkeeping
    assert store.stats()["expired"] >= 1


def with_output(rid: str, owner: str = "team-a") -> StoredResponse:
    return StoredResponse(id=rid, response={"id": rid, "output": [
                              {"id": f"msg-{rid}", "type": "message", "text": rid}]},
                          input_items=({"id": f"in-{rid}", "content": "x"},),
                          previous_id=None, worker="w1", created_at=time.time(), owner=owner)


async def test_items_by_id_across_links_owner_checked_and_dropped(links) -> None:
    a, b = (RedisResponseStore(link, max_items=3) for link in links)
    await a.put(with_output("r1"))
    await a.put(with_output("r2", owner="team-b"))
    found = await b.get_items("team-a", ["msg-r1", "in-r1", "msg-r2", "nope", "msg-r1"])
    assert found == {"msg-r1": {"id": "msg-r1", "type": "message", "text": "r1"},
                     "in-r1": {"id": "in-r1", "content": "x"}}
    assert await b.get_items("team-b", ["msg-r1"]) == {}       # another key's: not there
    assert await b.delete("r1")
    assert await a.get_items("team-a", ["msg-r1", "in-r1"]) == {}
    for i in range(5):  # evicted entries leave the index
        await b.put(with_output(f"e{i}"))
    client = links[0].client
    assert set(await client.hkeys(links[0].prefix + "rs:idx:team-a")) == {
        f"{kind}-e{i}".encode() for kind in ("msg", "in") for i in (3, 4)}
    assert await a.delete_owner("team-a") == 2
    assert not await client.exists(links[0].prefix + "rs:idx:team-a")
    assert await client.hlen(links[0].prefix + "rs:items") == 1          # team-b's r2


async def test_cli_index_shared_and_dropped_per_worker(links) -> None:
    # two links of one replica (its index outlives a restart with server.replica_id)
    a, b = (RedisUpstreamSessions(link, replica="r1") for link in links)
    await a.put("h1", "cli-1")
    await a.put("h2", "cli-1")
    await a.put("h3", "cli-2")
    assert await b.get("h1") == "cli-1"
    await b.drop_worker("cli-1")
    assert await a.get("h1") is None and await a.get("h2") is None
    assert await a.get("h3") == "cli-2"


async def test_cli_index_is_per_replica(links) -> None:
    """Worker names repeat across replicas (each runs its own ``cli-1``): one
    replica's index neither answers for nor drops another's conversations."""
    a, b = RedisUpstreamSessions(links[0], replica="r1"), RedisUpstreamSessions(links[1],
                                                                               replica="r2")
    await a.put("h1", "cli-1")
    assert await b.get("h1") is None  # r2's cli-1 does not hold it
    await b.put("h2", "cli-1")
    await b.drop_worker("cli-1")  # r2's cli-1 restarted: r1's entries stay
    assert await a.get("h1") == "cli-1" and await b.get("h2") is None


async def _members(client, pattern: str) -> dict[str, int]:
    """Each key matching ``pattern`` and how many members it holds, whatever its type."""
    sizes = {}
    async for key in client.scan_iter(match=pattern):
        kind = (await client.type(key)).decode()
        size = {"set": client.scard, "zset": client.zcard, "hash": client.hlen}[kind]
        sizes[key.decode()] = await size(key)
    return sizes


async def test_cli_index_entries_expire_one_by_one(links) -> None:
    """Every entry has its own time to live, and a worker's list of entries
    forgets each one as it expires (not only when the whole list idles out)."""
    client = links[0].client
    index = RedisUpstreamSessions(links[0], replica="r1", max_age=0.5)
    await index.put("old", "cli-1")
    await asyncio.sleep(0.3)
    await index.put("newer", "cli-1")
    await asyncio.sleep(0.3)                  # "old" expired, "newer" has 0.2 s left
    await index.put("newest", "cli-1")        # a busy worker: its list never idles out
    assert await index.get("old") is None and await index.get("newer") == "cli-1"
    [(name, size)] = (await _members(client, "poolgate:cliw*")).items()
    assert size == 2, name                    # "newer" and "newest", not "old"
    assert 0 < await client.pttl(name) <= 500
    entries = [key async for key in client.scan_iter(match="poolgate:cli:*")]
    ttls = [await client.pttl(k) for k in entries]
    assert len(ttls) == 2 and all(0 < ttl <= 500 for ttl in ttls)
    await asyncio.sleep(0.3)                  # "newer" expired: dropping the worker
    assert await index.get("newest") == "cli-1"
    await index.drop_worker("cli-1")          # deletes what it still held
    assert await index.get("newest") is None
    assert not await _members(client, "poolgate:cliw*")


async def test_rpm_and_tokens_counted_across_links(links) -> None:
    a, b = (RedisLimits(link, MemoryLimits()) for link in links)
    policy = KeyPolicy("team-r", rpm=3, tpm=100)
    assert await a.admit(policy) is None
    assert await b.admit(policy) is None
    assert await a.admit(policy) is None
    refusal = await b.admit(policy)
    assert refusal is not None and refusal.limit == "requests"
    assert 0 < refusal.retry_after <= 60 and refusal.window.requests_remaining == 0
    tokens = KeyPolicy("team-t", tpm=10)
    assert await a.admit(tokens) is None
    b.charge("team-t", 12)
    await b.flush()
    refusal = await a.admit(tokens)
    assert refusal is not None and refusal.limit == "tokens"
    budget = KeyPolicy("team-d", budget_day=50)
    await a.seed("team-d", 60, 60)
    refusal = await b.admit(budget)
    assert refusal is not None and refusal.limit == "budget_day" and refusal.budget == 50
    await b.forget("team-r")
    assert await a.admit(policy) is None


async def test_one_login_at_a_time_across_links(links) -> None:
    locks = [RedisLocks(link, poll=0.01) for link in links]
    inside: list[int] = []
    most = 0

    async def login(lock: RedisLocks, n: int) -> None:
        nonlocal most
        async with lock.hold("login:acct-1", ttl=5, wait=5):
            inside.append(n)
            most = max(most, len(inside))
            await asyncio.sleep(0.05)
            inside.remove(n)

    await asyncio.gather(*(login(locks[i % 2], i) for i in range(6)))
    assert most == 1
    async with locks[0].hold("login:acct-2", ttl=5):
        with pytest.raises(LockTimeout):
            async with locks[1].hold("login:acct-2", ttl=5, wait=0.1):
                pass


async def test_drained_set_shared(links) -> None:
    a, b = (RedisDrainedSet(link) for link in links)
    await a.add("w1")
    assert await b.members() == {"w1"}
    await b.discard("w1")
    assert await a.members() == set()


async def test_lost_redis_fails_fast_falls_back_and_recovers(server: RedisServer, links) -> None:
    link = links[0]
    bindings = RedisBindingStore(link, fresh=0)
    responses = RedisResponseStore(link)
    limits = RedisLimits(link, MemoryLimits())
    await bindings.set("s", "w1")
    await responses.put(entry("r1"))
    server.kill()
    start = time.monotonic()
    assert await bindings.get("s") == "w1"        # the first call finds it gone...
    assert not link.up
    assert await bindings.get("s") == "w1"        # ...then the local cache answers at once
    with pytest.raises(StoreUnavailable) as unavailable:
        await responses.get("r1")
    assert unavailable.value.status == 503 and unavailable.value.code == "store_unavailable"
    policy = KeyPolicy("team-r", rpm=1)
    assert await limits.admit(policy) is None      # counted locally
    assert (await limits.admit(policy)).limit == "requests"
    # redis-py's default retries would take ~4.5 s per call here
    assert time.monotonic() - start < link.timeout + 0.5
    watch = asyncio.ensure_future(link.watch())
    try:
        server.start()
        deadline = time.monotonic() + 5
        while not link.up:
            assert time.monotonic() < deadline, "the link did not come back within 5 s"
            await asyncio.sleep(0.02)
        await responses.put(entry("r2"))
        assert (await responses.get("r2")).id == "r2"
    finally:
        watch.cancel()


async def test_a_hung_redis_costs_one_timeout_then_nothing(server: RedisServer, links) -> None:
    import signal
    link = links[0]
    bindings = RedisBindingStore(link, fresh=0)
    await bindings.set("s", "w1")
    server.proc.send_signal(signal.SIGSTOP)  # alive but silent: the worst case
    try:
        start = time.monotonic()
        assert await bindings.get("s") == "w1"
        first = time.monotonic() - start
        start = time.monotonic()
        for _ in range(100):
            assert await bindings.get("s") == "w1"
        rest = time.monotonic() - start
    finally:
        server.proc.send_signal(signal.SIGCONT)
    assert first < link.timeout + 0.1 and rest < 0.1
    assert await link.ping()
    assert await bindings.get("s") == "w1"


async def test_charges_batched_into_one_script_call(links) -> None:
    a, b = (RedisLimits(link, MemoryLimits()) for link in links)
    await a.seed("k0", 0, 0)   # loads the script
    before = await script_calls(links[0])
    for key in ("k1", "k2"):
        for _ in range(5):
            a.charge(key, 3)   # 10 charges of two keys, one flush
    await a.flush()
    assert await script_calls(links[0]) - before == 1
    for key in ("k1", "k2"):
        refusal = await b.admit(KeyPolicy(key, tpm=15))
        assert refusal is not None and refusal.window.tokens_remaining == 0
        assert await b.admit(KeyPolicy(key, tpm=16)) is None


async def test_fresh_bindings_skip_the_round_trip_but_see_moves_later(links) -> None:
    clock = [0.0]
    a = RedisBindingStore(links[0], fresh=1.0, clock=lambda: clock[0])
    b = RedisBindingStore(links[1])
    await a.set("s", "w1")
    await b.claim("s", "w1", "w2")             # B moves the session
    assert await a.get("s") == "w1"            # within `fresh`: A's mirror answers
    assert a.stats()["fresh_local_hits"] == 1
    clock[0] = 1.5
    assert await a.get("s") == "w2"            # after it: Redis, and the move


async def script_calls(link: RedisLink) -> int:
    stats = await link.client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


async def shared_requests(link: RedisLink, key: str) -> int:
    return int(await link.client.hget(f"poolgate:lim:{key}", "req") or 0)


async def test_rpm_exact_across_replicas_with_few_round_trips(links) -> None:
    a, b = (RedisLimits(link, MemoryLimits()) for link in links)
    policy = KeyPolicy("busy", rpm=3000)
    admitted = {"a": 0, "b": 0}

    async def replica(name: str, limits: RedisLimits) -> None:
        while True:
            refusal = await limits.admit(policy)
            if refusal is not None:
                assert refusal.limit == "requests"
                await limits.flush()  # a refresh in flight may still bring a leased request
                refusal = await limits.admit(policy)
                if refusal is not None:
                    return
            admitted[name] += 1
            await asyncio.sleep(0)  # let the other replica and the lease refreshes run

    await asyncio.gather(replica("a", a), replica("b", b))
    assert admitted["a"] + admitted["b"] == 3000      # not one over, not one short
    assert min(admitted.values()) > 300               # both replicas were served
    assert await shared_requests(links[0], "busy") == 3000
    calls = await script_calls(links[0])
    assert calls < 3000 / 5, f"{calls} script calls for 3000 requests"
    assert a.lease_hits + b.lease_hits > 2400


async def test_an_idle_lease_goes_back_to_the_other_replicas(links) -> None:
    a, b = (RedisLimits(link, MemoryLimits()) for link in links)
    policy = KeyPolicy("idle", rpm=10_000)
    for _ in range(200):
        assert await a.admit(policy) is None
    await a.flush()
    held = await shared_requests(links[0], "idle")
    assert held > 200                                 # a holds leased requests it has not used
    deadline = time.monotonic() + LIFETIME + 2
    while await shared_requests(links[0], "idle") != 200:
        assert time.monotonic() < deadline, "the idle lease was not given back"
        await asyncio.sleep(0.05)
    for _ in range(10_000 - 200):                     # b may now use all the rest
        assert await b.admit(policy) is None
    assert (await b.admit(policy)).limit == "requests"


async def test_tokens_charged_elsewhere_stop_a_lease_within_its_lifetime(links) -> None:
    a, b = (RedisLimits(link, MemoryLimits()) for link in links)
    policy = KeyPolicy("tokens", tpm=1_000_000)
    for _ in range(100):
        assert await a.admit(policy) is None
        a.charge("tokens", 10)
        await asyncio.sleep(0.001)
    await a.flush()
    b.charge("tokens", 2_000_000)                     # another replica's answers
    await b.flush()
    start = time.monotonic()
    after = 0
    while (refusal := await a.admit(policy)) is None:
        after += 1
        assert time.monotonic() - start < LIFETIME + 1, "a kept admitting past its lease"
        await asyncio.sleep(0.005)
    assert refusal.limit == "tokens"
    # sized to use at most 1/16 of the tokens left: 1e6 / (16 * 10) requests
    assert after <= 1_000_000 // (16 * 10)
    assert await b.admit(policy) is not None


async def test_leases_off_asks_redis_for_every_request(links) -> None:
    limits = RedisLimits(links[0], MemoryLimits(), leases=False)
    assert await limits.admit(KeyPolicy("each", rpm=10_000)) is None  # loads the script
    before = await script_calls(links[0])
    for _ in range(50):
        assert await limits.admit(KeyPolicy("each", rpm=10_000)) is None
    assert await script_calls(links[0]) - before == 50


async def test_a_lost_redis_costs_a_leased_key_at_most_one_timeout(server: RedisServer,
                                                                  links) -> None:
    limits = RedisLimits(links[0], MemoryLimits())
    policy = KeyPolicy("lost", rpm=10**6)
    for _ in range(200):
        assert await limits.admit(policy) is None
        await asyncio.sleep(0)
    server.kill()
    start = time.monotonic()
    for _ in range(300):  # the lease, then a refresh that finds Redis gone, then local counts
        assert await limits.admit(policy) is None
        await asyncio.sleep(0)
    assert time.monotonic() - start < links[0].timeout + 0.5
    assert not links[0].up and limits.fallbacks > 0


async def test_closing_gives_the_leases_back(links) -> None:
    limits = RedisLimits(links[0], MemoryLimits())
    policy = KeyPolicy("closing", rpm=10**6)
    for _ in range(200):
        assert await limits.admit(policy) is None
    limits.charge("closing", 7)
    await limits.flush()
    assert await shared_requests(links[0], "closing") > 200   # leased, not used yet
    await limits.aclose()
    assert await shared_requests(links[0], "closing") == 200
    assert await links[1].client.hget("poolgate:lim:closing", "tok") == b"7"


async def test_a_flushed_redis_is_found_and_rebuilt_from_the_floor(server: RedisServer,
                                                                   links) -> None:
    a, b = (RedisLimits(link, MemoryLimits()) for link in links)
    budget = KeyPolicy("team-d", budget_day=50)
    await a.rebuild({"team-d": (10, 10)})  # the ledger's totals at start
    a.charge("team-d", 60)  # over, by this replica's own charge
    await a.flush()
    assert not await a.lost()
    client = server.client()
    try:
        client.flushall()
    finally:
        client.close()
    assert (await a.admit(budget)).limit == "budget_day"  # its floor, whatever Redis says
    assert await a.lost()
    await a.rebuild({"team-d": (10, 10)})  # the ledger lags: the floor wins
    assert not await a.lost()
    refusal = await b.admit(budget)  # B never saw the key's usage: Redis has it back
    assert refusal is not None and refusal.limit == "budget_day"

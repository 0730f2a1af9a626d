"""Routing policies: rendezvous placement, session affinity, least in flight, the factory."""

from __future__ import annotations

import ast
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pool.model import ChatRequest, Message, TextPart
from pool.routing import (
    POLICIES, LeastInFlight, RoutingPolicy, SessionAffinity, binding_key, make_policy,
    rendezvous,
)
from sessions.bindings import MemoryBindingStore
from tests.support.paths import REPO


@dataclass(frozen=True)
class FakeWorker:
    """The policies only look at a worker's name."""

    name: str


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pool_of(n: int, start: int = 0) -> list[Any]:
    return [FakeWorker(f"w{i}") for i in range(start, start + n)]


REQUEST = ChatRequest(model="m", dialect="openai_chat",
                      messages=(Message("user", (TextPart("hi"),)),))
OTHER_MODEL = ChatRequest(model="small", dialect="openai_chat", messages=REQUEST.messages)
SESSIONS = [f"session:{i:05d}" for i in range(10_000)]


def affinity(clock: FakeClock | None = None, loads: dict[str, int] | None = None,
             **kwargs: Any) -> tuple[SessionAffinity, MemoryBindingStore]:
    store = MemoryBindingStore(ttl=600, clock=clock or FakeClock())
    loads = loads if loads is not None else {}
    policy = SessionAffinity(store, fallback=LeastInFlight(lambda n: loads.get(n, 0)),
                             in_flight=lambda n: loads.get(n, 0), **kwargs)
    return policy, store


# --- rendezvous hashing ----------------------------------------------------------------------

def test_rendezvous_is_stable_and_independent_of_order() -> None:
    workers = pool_of(6)
    for key in SESSIONS[:200]:
        chosen = rendezvous(key, workers)
        assert rendezvous(key, list(reversed(workers))) is chosen
        assert rendezvous(key, random.Random(key).sample(workers, 6)) is chosen


def test_rendezvous_spreads_sessions_evenly() -> None:
    counts = Counter(rendezvous(k, pool_of(4)).name for k in SESSIONS)
    assert set(counts) == {"w0", "w1", "w2", "w3"}
    assert all(2_000 < c < 3_000 for c in counts.values()), counts


def test_adding_a_fifth_worker_moves_about_a_fifth_and_only_to_it() -> None:
    four, five = pool_of(4), pool_of(5)
    before = {k: rendezvous(k, four).name for k in SESSIONS}
    after = {k: rendezvous(k, five).name for k in SESSIONS}
    moved = [k for k in SESSIONS if before[k] != after[k]]
    assert 0.15 <= len(moved) / len(SESSIONS) <= 0.25
    assert {after[k] for k in moved} == {"w4"}


def test_removing_a_worker_moves_only_its_sessions() -> None:
    five = pool_of(5)
    before = {k: rendezvous(k, five).name for k in SESSIONS}
    without_w2 = [w for w in five if w.name != "w2"]
    after = {k: rendezvous(k, without_w2).name for k in SESSIONS}
    moved = {k for k in SESSIONS if before[k] != after[k]}
    assert moved == {k for k in SESSIONS if before[k] == "w2"}
    # ...and they spread over all the others, not onto one neighbour.
    assert {after[k] for k in moved} == {"w0", "w1", "w3", "w4"}


# --- session affinity ----------------------------------------------------------------------

async def test_same_session_same_worker_for_100_turns_even_when_others_are_idle() -> None:
    loads = {"w0": 0, "w1": 0, "w2": 0, "w3": 0}
    policy, _ = affinity(loads=loads)
    workers = pool_of(4)
    first = await policy.choose(REQUEST, "session:a", workers)
    for turn in range(100):
        loads[first.name] = 50 + turn  # affinity beats load
        assert await policy.choose(REQUEST, "session:a", workers) is first
    assert policy.stats() == {"hits": 100, "binds": 1, "rebinds": 0, "spills": 0,
                              "no_session": 0, "load_moves": 0, "load_rebinds": 0}


async def test_an_implicit_session_yields_to_load_and_its_binding_follows_for_good() -> None:
    loads = {"w0": 0, "w1": 0, "w2": 0}
    policy, store = affinity(loads=loads, imbalance_abs=2, imbalance_rel=1.5)
    workers = pool_of(3)
    home = await policy.choose(REQUEST, "content:abc", workers)
    key = binding_key("m", "content:abc")
    loads[home.name] = 2  # within the absolute threshold: stays
    assert await policy.choose(REQUEST, "content:abc", workers) is home
    loads[home.name] = 3  # 3 more than an idle worker, and over 1.5x: moves, binding stays
    moved = await policy.choose(REQUEST, "content:abc", workers)
    assert moved is not home and loads[moved.name] == 0
    assert await store.get(key) == home.name
    loads[home.name] = 0  # balanced again: home
    assert await policy.choose(REQUEST, "content:abc", workers) is home
    loads[home.name] = 9  # moved on two consecutive turns: the binding follows
    first = await policy.choose(REQUEST, "content:abc", workers)
    second = await policy.choose(REQUEST, "content:abc", workers)
    assert first is not home and second is not home
    assert await store.get(key) == second.name
    assert policy.stats()["load_moves"] == 3 and policy.stats()["load_rebinds"] == 1


async def test_the_relative_threshold_keeps_busy_but_balanced_workers() -> None:
    loads = {"w0": 10, "w1": 10, "w2": 10}
    policy, _ = affinity(loads=loads, imbalance_abs=2, imbalance_rel=1.5)
    workers = pool_of(3)
    home = await policy.choose(REQUEST, "user:alice", workers)
    loads[home.name] = 14  # 4 more than the others, but under 1.5x their load
    assert await policy.choose(REQUEST, "user:alice", workers) is home
    loads[home.name] = 16
    assert await policy.choose(REQUEST, "user:alice", workers) is not home


async def test_owned_session_keys_are_read_after_the_owner() -> None:
    loads = {"w0": 0, "w1": 0, "w2": 0}
    policy, _ = affinity(loads=loads, owned=True)
    workers = pool_of(3)
    for session, yields in (("team-a:content:abc", True), ("content:session:x", False)):
        home = await policy.choose(REQUEST, session, workers)
        loads[home.name] = 9
        assert (await policy.choose(REQUEST, session, workers) is not home) is yields
        loads[home.name] = 0


async def test_explicit_sessions_do_not_yield_to_load() -> None:
    loads = {"w0": 0, "w1": 0, "w2": 0}
    policy, _ = affinity(loads=loads)
    workers = pool_of(3)
    for session in ("session:x", "response:resp_1", "cache:k"):
        home = await policy.choose(REQUEST, session, workers)
        loads[home.name] = 40
        assert await policy.choose(REQUEST, session, workers) is home
        loads[home.name] = 0
    assert policy.stats()["load_moves"] == 0


async def test_new_sessions_are_placed_by_rendezvous_hash() -> None:
    policy, store = affinity()
    workers = pool_of(3)
    for key in SESSIONS[:300]:
        chosen = await policy.choose(REQUEST, key, workers)
        assert chosen is rendezvous(key, workers)
        assert await store.get(binding_key("m", key)) == chosen.name
    assert policy.stats()["binds"] == 300


async def test_ineligible_bound_worker_rebinds_and_does_not_move_back() -> None:
    clock = FakeClock()
    policy, store = affinity(clock)
    workers = pool_of(3)
    home = await policy.choose(REQUEST, "session:a", workers)
    survivors = [w for w in workers if w is not home]
    moved = await policy.choose(REQUEST, "session:a", survivors)
    assert moved is not home and moved is rendezvous("session:a", survivors)
    assert policy.stats()["rebinds"] == 1
    # The old worker is back: the session stays where its cache now is...
    clock.now += 500
    assert await policy.choose(REQUEST, "session:a", workers) is moved
    # ...until the binding expires (idle for a whole ttl); then the hash places it home.
    clock.now += 601
    assert await policy.choose(REQUEST, "session:a", workers) is home
    assert policy.stats() == {"hits": 1, "binds": 2, "rebinds": 1, "spills": 0, "no_session": 0,
                              "load_moves": 0, "load_rebinds": 0}
    assert store.stats()["expired"] == 1


async def test_busy_bound_worker_spills_one_request_without_rebinding() -> None:
    full: set[str] = set()
    policy, store = affinity(busy=full.__contains__)
    workers = pool_of(3)
    home = await policy.choose(REQUEST, "session:a", workers)
    full.add(home.name)
    free = [w for w in workers if w is not home]
    spilled = await policy.choose(REQUEST, "session:a", free)
    assert spilled is not home
    assert await store.get(binding_key("m", "session:a")) == home.name
    full.clear()
    assert await policy.choose(REQUEST, "session:a", workers) is home
    assert policy.stats() == {"hits": 1, "binds": 1, "rebinds": 0, "spills": 1, "no_session": 0,
                              "load_moves": 0, "load_rebinds": 0}


async def test_bindings_are_per_model() -> None:
    policy, _ = affinity()
    big, small = pool_of(2), pool_of(2, start=10)
    for _ in range(3):  # Claude Code alternates its main and its small model in one session
        assert (await policy.choose(REQUEST, "session:a", big)).name in {"w0", "w1"}
        assert (await policy.choose(OTHER_MODEL, "session:a", small)).name in {"w10", "w11"}
    assert policy.stats()["binds"] == 2 and policy.stats()["rebinds"] == 0


async def test_no_session_falls_back_to_least_in_flight() -> None:
    loads = {"w0": 3, "w1": 1, "w2": 2}
    policy, store = affinity(loads=loads)
    assert (await policy.choose(REQUEST, None, pool_of(3))).name == "w1"
    assert policy.stats()["no_session"] == 1 and len(store) == 0


async def test_binding_ttl_given_to_the_policy_is_used() -> None:
    clock = FakeClock()
    policy, store = affinity(clock, ttl=5)
    await policy.choose(REQUEST, "session:a", pool_of(2))
    clock.now += 6
    assert await store.get(binding_key("m", "session:a")) is None


# --- least in flight ---------------------------------------------------------------------------

@pytest.mark.parametrize(("loads", "expected"), [
    ({"w0": 5, "w1": 2, "w2": 9}, "w1"),
    ({"w0": 0, "w1": 2, "w2": 9}, "w0"),
    ({"w0": 7, "w1": 7, "w2": 1}, "w2"),
])
async def test_least_in_flight_picks_the_least_busy(loads: dict[str, int], expected: str) -> None:
    policy = LeastInFlight(loads.__getitem__)
    assert (await policy.choose(REQUEST, None, pool_of(3))).name == expected
    assert (await policy.choose(REQUEST, "session:x", pool_of(3))).name == expected


async def test_least_in_flight_ties_go_round_robin_without_a_session() -> None:
    policy = LeastInFlight(lambda name: 0)
    chosen = Counter([(await policy.choose(REQUEST, None, pool_of(3))).name for _ in range(30)])
    assert chosen == {"w0": 10, "w1": 10, "w2": 10}
    assert policy.stats() == {"picks": 30}


async def test_least_in_flight_ties_go_to_the_sessions_rendezvous_winner() -> None:
    policy = LeastInFlight(lambda name: 0)
    workers = pool_of(4)
    for key in SESSIONS[:50]:
        for _ in range(3):
            assert await policy.choose(REQUEST, key, workers) is rendezvous(key, workers)


async def test_single_worker_is_chosen_without_asking_its_load() -> None:
    def no_load(name: str) -> int:
        raise AssertionError("not needed for one worker")
    only = pool_of(1)
    assert await LeastInFlight(no_load).choose(REQUEST, None, only) is only[0]


# --- the factory -------------------------------------------------------------------------------

async def test_make_policy_by_configured_name() -> None:
    loads = {"w0": 1, "w1": 0}
    store = MemoryBindingStore()
    policies: dict[str, RoutingPolicy] = {
        name: make_policy(name, in_flight=loads.__getitem__, store=store) for name in POLICIES}
    assert isinstance(policies["session_affinity"], SessionAffinity)
    assert isinstance(policies["least_in_flight"], LeastInFlight)
    for policy in policies.values():
        assert (await policy.choose(REQUEST, None, pool_of(2))).name == "w1"
    assert POLICIES[0] == "session_affinity"  # the default


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("round_robin", {}, "unknown routing policy"),
    ("session_affinity", {"store": None}, "needs a binding store"),
])
def test_make_policy_refuses_what_it_cannot_build(name: str, kwargs: dict[str, Any],
                                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(name, in_flight=lambda n: 0, **kwargs)


class OtherReplica(MemoryBindingStore):
    """A store where another replica claims every binding first (as ``claim`` would report)."""

    def __init__(self, winner: str) -> None:
        super().__init__(ttl=600)
        self.winner = winner

    async def claim(self, key: str, expected: str | None, worker: str,
                    ttl: float | None = None) -> str:
        await self.set(key, self.winner, ttl)
        return self.winner


async def test_a_lost_claim_follows_the_winner_when_it_can() -> None:
    workers = pool_of(3)
    session = next(s for s in SESSIONS if rendezvous(s, workers).name != "w2")
    policy = SessionAffinity(OtherReplica("w2"), fallback=LeastInFlight(lambda n: 0))
    assert (await policy.choose(REQUEST, session, workers)).name == "w2"
    # the winner is not among ours: keep our choice (the binding is the other replica's)
    policy = SessionAffinity(OtherReplica("w9"), fallback=LeastInFlight(lambda n: 0))
    assert (await policy.choose(REQUEST, session, workers)).name == rendezvous(session, workers).name


async def test_held_by_names_an_explicit_sessions_worker_only() -> None:
    """What the gateway asks before placing a cli conversation by quota: an
    explicit session already bound keeps its account; a guess does not."""
    policy, store = affinity()
    workers = pool_of(3)
    bound = await policy.choose(REQUEST, "header:abc", workers)
    assert await policy.held_by(REQUEST, "header:abc") == bound.name
    assert await policy.held_by(OTHER_MODEL, "header:abc") is None  # bindings are per model
    await policy.choose(REQUEST, "content:xyz", workers)
    assert await policy.held_by(REQUEST, "content:xyz") is None
    assert await policy.held_by(REQUEST, None) is None
    prefix = make_policy("prefix_cache", in_flight=lambda n: 0, store=store)
    assert await prefix.held_by(REQUEST, "header:abc") == bound.name


async def test_memory_claim_is_compare_and_set() -> None:
    clock = FakeClock()
    store = MemoryBindingStore(ttl=10, clock=clock)
    assert await store.claim("k", None, "w1") == "w1"
    assert await store.claim("k", None, "w2") == "w1"
    assert await store.claim("k", "w1", "w2") == "w2"
    assert await store.claim("k", "w1", "w3") == "w2"
    clock.now = 11  # expired: unbound again
    assert await store.claim("k", None, "w3") == "w3"


# --- package direction -------------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.add("." if node.level else (node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found


@pytest.mark.parametrize(("module", "forbidden"), [
    ("pool/routing.py", {"app", "sessions", "auth"}),
    ("sessions/keys.py", {"app", "auth"}),
    ("sessions/bindings.py", {"app", "auth"}),
    *((f"sessions/{name}.py", {"app", "auth"}) for name in (
        "redis_link", "redis_bindings", "redis_responses", "redis_limits", "shared", "workers")),
    ("pool/pool.py", {"app", "sessions", "auth"}),
])
def test_imports_follow_the_package_direction(module: str, forbidden: set[str]) -> None:
    imports = _imports(REPO / module)
    assert imports and not imports & forbidden

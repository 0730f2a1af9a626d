"""Prefix-cache-aware routing: the hashed block chain, the bounded per-worker
index (longest match, LRU and age eviction), and the ``prefix_cache`` policy."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from pool.model import ChatRequest, Message, TextPart, Tool
from pool.prefix import PrefixIndex, block_chain, render_prompt
from pool.routing import make_policy
from sessions.bindings import MemoryBindingStore

BLOCK = 16
SYSTEM = "You are a careful assistant. " * 20  # 580 characters: 36 blocks of 16


@dataclass
class W:
    name: str
    kind: str = "remote"
    restarts: int = 0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chat(*turns: tuple[str, str], system: str | None = SYSTEM, **kw: Any) -> ChatRequest:
    messages = [Message(role, (TextPart(text),)) for role, text in turns]  # type: ignore[arg-type]
    if system is not None:
        messages.insert(0, Message("system", (TextPart(system),)))
    return ChatRequest(model="m", dialect="openai_chat", messages=tuple(messages), **kw)


def chain(request: ChatRequest) -> list[bytes]:
    return block_chain(render_prompt(request), BLOCK)


# --- rendering and the chain ----------------------------------------------------------------

def test_a_later_turn_renders_to_a_continuation_of_the_earlier_one():
    first = chat(("user", "hello"))
    later = chat(("user", "hello"), ("assistant", "hi there"), ("user", "and now?"))
    assert render_prompt(later).startswith(render_prompt(first))
    a, b = chain(first), chain(later)
    assert b[:len(a)] == a and len(b) > len(a)


def test_system_messages_and_tools_come_first_wherever_the_client_put_them():
    tools = (Tool("lookup", "find a thing", {"type": "object"}),)
    hoisted = ChatRequest(model="m", dialect="anthropic", tools=tools, messages=(
        Message("user", (TextPart("q"),)), Message("system", (TextPart(SYSTEM),))))
    plain = chat(("user", "q"), tools=tools)
    assert render_prompt(hoisted) == render_prompt(plain)
    assert render_prompt(plain) != render_prompt(chat(("user", "q")))  # tools count


def test_only_full_blocks_are_hashed_and_each_hash_covers_the_prefix():
    assert block_chain("x" * (BLOCK - 1), BLOCK) == []
    same_block_other_prefix = block_chain("a" * BLOCK + "b" * BLOCK, BLOCK)
    other = block_chain("c" * BLOCK + "b" * BLOCK, BLOCK)
    assert len(same_block_other_prefix) == 2 and same_block_other_prefix[1] != other[1]


# --- the index -------------------------------------------------------------------------------

def test_longest_match_names_the_workers_holding_the_deepest_prefix():
    index = PrefixIndex(max_blocks=10_000, max_age=60)
    short = chain(chat(("user", "a"), system=SYSTEM[:200]))
    long_a = chain(chat(("user", "first question, about the weather")))
    long_b = chain(chat(("user", "first question, about the harbour")))
    index.insert("w0", short)
    index.insert("w1", long_a)
    index.insert("w2", long_b)
    ask = chain(chat(("user", "first question, about the weather in May")))
    depth, holders = index.longest(ask, ["w0", "w1", "w2"])
    assert holders == ["w1"] and depth == len(long_a)
    # only the shared system prompt: w1 and w2 both hold it, w0 only part
    depth, holders = index.longest(chain(chat(("user", "zzz" * 20))), ["w0", "w1", "w2"])
    assert sorted(holders) == ["w1", "w2"] and depth >= len(SYSTEM) // BLOCK
    assert index.longest(ask, ["w0"])[0] < depth  # restricted to the workers offered
    assert index.longest(chain(chat(("user", "x"), system="other " * 50)), ["w1"]) == (0, [])


def test_memory_is_bounded_per_worker_and_the_least_recent_blocks_go_first():
    index = PrefixIndex(max_blocks=100, max_age=60)
    keep = chain(chat(("user", "keep me")))  # ~38 blocks
    index.insert("w", keep)
    for i in range(50):  # other prompts, each ~38 blocks of its own
        index.insert("w", chain(chat(("user", "x"), system=f"{i} unrelated prompt " * 40)))
        assert index.sizes()["w"] <= 100
    assert index.longest(keep, ["w"]) == (0, [])
    assert index.evicted > 0
    # the first blocks of a prompt are the last of it to go
    index = PrefixIndex(max_blocks=10, max_age=60)
    index.insert("w", keep)
    depth, _ = index.longest(keep, ["w"])
    assert depth == 10 and index.sizes() == {"w": 10}


def test_blocks_are_forgotten_after_max_age_and_refreshed_by_use():
    clock = Clock()
    index = PrefixIndex(max_blocks=1000, max_age=60, clock=clock)
    old, fresh = chain(chat(("user", "old one"))), chain(chat(("user", "x"), system="fresh " * 40))
    index.insert("w", old)
    clock.now = 50
    index.insert("w", fresh)
    clock.now = 70  # old: 70 s unused; fresh: 20 s
    assert index.longest(old, ["w"]) == (0, [])
    assert index.longest(fresh, ["w"])[0] == len(fresh)
    index.insert("w", fresh)
    assert index.sizes()["w"] == len(fresh)  # the expired ones were dropped on insert
    index.forget("w")
    assert index.sizes() == {}


def test_a_block_costs_a_bounded_number_of_bytes():
    index = PrefixIndex(max_blocks=5000, max_age=60)
    for i in range(200):
        index.insert("w", chain(chat(("user", str(i)), system=f"{i} prompt " * 40)))
    blocks = index._workers["w"]  # the structure whose size is bounded
    per_block = (sys.getsizeof(blocks) + sum(sys.getsizeof(k) for k in blocks)) / len(blocks)
    assert len(blocks) == 5000 and per_block < 200, per_block


# --- the policy --------------------------------------------------------------------------------

def policy(loads: dict[str, int], **knobs: Any) -> Any:
    return make_policy("prefix_cache", in_flight=lambda n: loads.get(n, 0),
                       store=MemoryBindingStore(ttl=600), imbalance_abs=2, imbalance_rel=1.5, owned=True,
                       prefix={"block_chars": BLOCK, "min_match": 64, **knobs})


async def route(p: Any, request: ChatRequest, workers: list[W],
                session: str | None = None) -> str:
    worker = await p.choose(request, session, workers)
    p.placed(request, worker)
    return worker.name


def test_conversations_sharing_a_system_prompt_follow_it_until_load_says_otherwise():
    async def go() -> None:
        loads: dict[str, int] = {}
        p = policy(loads)
        workers = [W("w0"), W("w1"), W("w2")]
        home = await route(p, chat(("user", "first")), workers)
        assert p.stats()["prefix_misses"] == 1
        for i in range(5):
            assert await route(p, chat(("user", f"different opening {i}")), workers) == home
        assert p.stats()["prefix_hits"] == 5
        assert p.prefix_stats()["matched_chars"] >= 5 * (len(SYSTEM) // BLOCK) * BLOCK
        # another system prompt: a miss, placed on an idle worker
        loads[home] = 1
        other = await route(p, chat(("user", "q"), system="Another long prompt. " * 30), workers)
        assert other != home
        # home busy past both thresholds (4 > 0 + 2 and 4 > 1.5 * 0): the least loaded takes it
        loads.update({home: 4, other: 0})
        moved = await route(p, chat(("user", "while busy")), workers)
        assert moved != home and p.stats()["load_moves"] == 1
        # the moved request left the prompt on `moved` too: both now hold it, the
        # less loaded of them takes the next one, never the third worker
        third = ({"w0", "w1", "w2"} - {home, moved}).pop()
        loads.update({home: 1, moved: 2, third: 0})
        assert await route(p, chat(("user", "later")), workers) == home
        loads.update({home: 2, moved: 1})
        assert await route(p, chat(("user", "later still")), workers) == moved

    asyncio.run(go())


def test_an_explicit_session_wins_over_a_prefix_and_short_prompts_do_not_match():
    async def go() -> None:
        p = policy({})
        workers = [W("w0"), W("w1"), W("w2")]
        home = await route(p, chat(("user", "a")), workers)
        implicit = await route(p, chat(("user", "c")), workers, "team:content:abc")
        assert implicit == home  # a content hash is no client's word: the prefix wins
        sessions = [f"team:session:{i}" for i in range(12)]
        placed = {await route(p, chat(("user", "b")), workers, s) for s in sessions}
        assert len(placed) > 1 and p.stats()["sessions"] == 12  # hashed, not all to `home`
        tiny = chat(("user", "hi"), system="be brief")
        await route(p, tiny, workers)
        assert p.stats()["prefix_misses"] == 2  # under min_match: never a hit

    asyncio.run(go())


def test_cli_workers_are_routed_by_affinity_and_not_indexed():
    async def go() -> None:
        p = policy({})
        workers = [W("c0", "cli"), W("c1", "cli")]
        await route(p, chat(("user", "a")), workers, "team:session:x")
        assert p.prefix_stats()["blocks"] == {} and p.stats()["sessions"] == 1

    asyncio.run(go())


def test_unknown_policy_names_are_refused_and_prefix_cache_needs_a_store():
    with pytest.raises(ValueError, match="prefix_cache"):
        make_policy("prefix_cache", in_flight=lambda n: 0)


def test_a_restarted_worker_is_remembered_as_empty():
    async def go() -> None:
        p = policy({})
        workers = [W("w0", "local"), W("w1", "local")]
        home = await route(p, chat(("user", "a")), workers)
        assert await route(p, chat(("user", "b")), workers) == home
        assert p.stats()["prefix_hits"] == 1
        restarted = next(w for w in workers if w.name == home)
        restarted.restarts += 1
        await route(p, chat(("user", "c")), workers)
        assert p.stats()["prefix_misses"] == 2  # its cache went with the old process

    asyncio.run(go())

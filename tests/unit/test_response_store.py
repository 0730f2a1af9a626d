"""The stored-Responses store: bounds, expiry, delete, concurrency, serialisation."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from sessions.responses import (
    BrokenChain, MemoryResponseStore, ResponseStore, StoredResponse, chain_input_items,
    conversation, dumps, load_chain, loads,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(rid: str, text: str = "hi", *, previous: str | None = None,
          worker: str | None = "w1", owner: str = "anonymous") -> StoredResponse:
    return StoredResponse(
        id=rid,
        response={"id": rid, "object": "response", "status": "completed",
                  "output": [{"id": f"msg_{rid}", "type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": f"echo: {text}"}]}]},
        input_items=({"id": f"in_{rid}", "type": "message", "role": "user",
                      "content": [{"type": "input_text", "text": text}]},),
        previous_id=previous, worker=worker, created_at=1.7e9, owner=owner)


def size(item: StoredResponse) -> int:
    return len(dumps(item))


def test_memory_store_is_a_response_store() -> None:
    store: ResponseStore = MemoryResponseStore()
    assert store.stats()["items"] == 0


async def test_put_get_roundtrip_and_unknown_id() -> None:
    store = MemoryResponseStore()
    item = entry("resp_1")
    await store.put(item)
    assert await store.get("resp_1") is item
    assert await store.get("resp_unknown") is None
    assert store.stats()["items"] == 1 and store.stats()["bytes"] == size(item)


async def test_put_same_id_replaces_without_leaking_bytes() -> None:
    store = MemoryResponseStore()
    await store.put(entry("r", "short"))
    newer = entry("r", "a much longer text than before")
    await store.put(newer)
    assert await store.get("r") is newer
    assert store.stats()["items"] == 1 and store.stats()["bytes"] == size(newer)


async def test_delete() -> None:
    store = MemoryResponseStore()
    await store.put(entry("r1"))
    await store.put(entry("r2"))
    assert await store.delete("r1") is True
    assert await store.delete("r1") is False
    assert await store.delete("never") is False
    assert await store.get("r1") is None
    assert (await store.get("r2")) is not None
    assert store.stats()["items"] == 1 and store.stats()["bytes"] == size(entry("r2"))


async def test_delete_owner_drops_only_that_keys_entries() -> None:
    store = MemoryResponseStore()
    await store.put(entry("a1", owner="key:a"))
    await store.put(entry("a2", owner="key:a"))
    await store.put(entry("b1", owner="key:b"))
    assert await store.delete_owner("key:a") == 2
    assert await store.get("a1") is None and await store.get("b1") is not None
    assert store.stats()["items"] == 1 and store.stats()["owners"] == 1
    assert store.stats()["bytes"] == size(entry("b1", owner="key:b"))
    assert await store.delete_owner("key:a") == 0


async def test_count_bound_evicts_oldest_first() -> None:
    store = MemoryResponseStore(max_items=3)
    for k in range(5):
        await store.put(entry(f"r{k}"))
    assert [await store.get(f"r{k}") is not None for k in range(5)] == [
        False, False, True, True, True]
    assert store.stats()["items"] == 3 and store.stats()["evicted"] == 2


async def test_byte_bound_evicts_oldest_first() -> None:
    one = size(entry("r0"))
    store = MemoryResponseStore(max_bytes=one * 2 + one // 2)  # room for two
    for k in range(4):
        await store.put(entry(f"r{k}"))
    assert await store.get("r0") is None and await store.get("r1") is None
    assert await store.get("r2") is not None and await store.get("r3") is not None
    assert store.stats()["bytes"] == 2 * one <= store.stats()["max_bytes"]


async def test_entry_larger_than_the_byte_bound_is_not_stored() -> None:
    store = MemoryResponseStore(max_bytes=size(entry("small")) + 10)
    await store.put(entry("small"))
    await store.put(entry("big", "x" * 1000))
    assert await store.get("big") is None
    assert await store.get("small") is not None  # not evicted for nothing
    assert store.stats()["rejected"] == 1


async def test_age_bound_with_a_fake_clock() -> None:
    clock = FakeClock()
    store = MemoryResponseStore(max_age=60, clock=clock)
    await store.put(entry("old"))
    clock.now += 30
    await store.put(entry("young"))
    clock.now += 29.9
    assert await store.get("old") is not None
    clock.now += 0.1  # "old" is now exactly 60 s old
    assert await store.get("old") is None
    assert await store.get("young") is not None
    assert store.stats()["expired"] == 1 and store.stats()["items"] == 1


async def test_expired_entries_are_dropped_on_put_without_being_read() -> None:
    clock = FakeClock()
    store = MemoryResponseStore(max_age=10, clock=clock)
    for k in range(3):
        await store.put(entry(f"r{k}"))
    clock.now += 11
    await store.put(entry("fresh"))
    assert store.stats()["items"] == 1 and store.stats()["expired"] == 3
    assert store.stats()["bytes"] == size(entry("fresh"))


async def test_delete_of_an_expired_entry_reports_false() -> None:
    clock = FakeClock()
    store = MemoryResponseStore(max_age=10, clock=clock)
    await store.put(entry("r"))
    clock.now += 10
    assert await store.delete("r") is False
    assert store.stats()["items"] == 0 and store.stats()["bytes"] == 0


@pytest.mark.parametrize("bad", [{"max_items": 0}, {"max_bytes": 0}, {"max_age": 0}])
def test_bounds_must_be_positive(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        MemoryResponseStore(**bad)


async def test_200_concurrent_tasks_lose_and_mix_nothing() -> None:
    store = MemoryResponseStore(max_items=10_000)
    rng = random.Random(7)

    async def roundtrip(k: int) -> None:
        item = entry(f"resp_{k}", f"text {k}", worker=f"w{k % 7}")
        await asyncio.sleep(rng.random() / 1000)
        await store.put(item)
        await asyncio.sleep(rng.random() / 1000)
        got = await store.get(f"resp_{k}")
        assert got is item

    await asyncio.gather(*(roundtrip(k) for k in range(200)))
    for k in range(200):
        got = await store.get(f"resp_{k}")
        assert got is not None and got.id == f"resp_{k}" and got.worker == f"w{k % 7}"
        assert got.input_items[0]["content"][0]["text"] == f"text {k}"
    assert store.stats()["items"] == 200
    assert store.stats()["bytes"] == sum(size(entry(f"resp_{k}", f"text {k}", worker=f"w{k % 7}"))
                                         for k in range(200))


async def test_bounds_hold_after_concurrent_puts() -> None:
    one = size(entry("resp_100", "text 100"))
    store = MemoryResponseStore(max_items=50, max_bytes=one * 40)

    async def put(k: int) -> None:
        await asyncio.sleep(0)
        await store.put(entry(f"resp_{k}", f"text {k}"))

    await asyncio.gather(*(put(k) for k in range(200)))
    stats = store.stats()
    assert 0 < stats["items"] <= 50 and stats["bytes"] <= one * 40
    present = [k for k in range(200) if await store.get(f"resp_{k}") is not None]
    assert len(present) == stats["items"]
    # what survives is the newest, and each survivor is its own entry
    assert present == list(range(200 - len(present), 200))
    for k in present:
        got = await store.get(f"resp_{k}")
        assert got is not None and got.input_items[0]["content"][0]["text"] == f"text {k}"


def test_conversation_is_each_turns_input_then_output() -> None:
    first = entry("r1", "one")
    second = entry("r2", "two", previous="r1")
    items = conversation([first, second])
    assert [i["id"] for i in items] == ["in_r1", "msg_r1", "in_r2", "msg_r2"]
    items[0]["id"] = "changed"  # the caller's copy, not the stored entry
    assert first.input_items[0]["id"] == "in_r1"
    assert [i["id"] for i in chain_input_items([first, second])] == ["in_r1", "msg_r1", "in_r2"]


def test_conversation_of_a_response_without_output() -> None:
    item = StoredResponse("r", {"id": "r", "output": []}, ({"id": "i", "type": "message"},), None,
                          None, 0.0)
    assert conversation([item]) == [{"id": "i", "type": "message"}]


def test_dumps_loads_roundtrip() -> None:
    item = entry("r2", "two", previous="r1")
    back = loads(dumps(item))
    assert back == item
    assert loads(dumps(StoredResponse("x", {}, (), None, None, 2.5))).worker is None


def test_owner_survives_a_round_trip() -> None:
    item = StoredResponse("x", {}, (), None, None, 2.5, owner="team-a")
    assert loads(dumps(item)).owner == "team-a"
    assert loads(dumps(StoredResponse("y", {}, (), None, None, 2.5))).owner == "anonymous"


# --- chains by reference (issue 15 item 8) --------------------------------------------------


async def _chain_of(store: MemoryResponseStore, n: int, owner: str = "anonymous",
                    prefix: str = "r") -> None:
    previous = None
    for i in range(n):
        await store.put(entry(f"{prefix}{i}", f"turn {i} " + "w" * 200, previous=previous,
                              owner=owner))
        previous = f"{prefix}{i}"


async def test_a_turn_costs_what_it_adds_not_the_whole_chain() -> None:
    store = MemoryResponseStore()
    await _chain_of(store, 300)
    one = size(entry("r299", "turn 299 " + "w" * 200, previous="r298"))
    # by value, turn k would hold k earlier turns: 300 turns ~ 45,000 turns' worth
    assert store.stats()["bytes"] <= 300 * one
    chain = await load_chain(store, "r299", "anonymous")
    assert chain is not None and [c.id for c in chain] == [f"r{i}" for i in range(300)]
    assert len(conversation(chain)) == 600


async def test_a_long_chain_evicts_its_own_turns_not_another_keys_responses() -> None:
    one = size(entry("b0", "turn 0 " + "w" * 200, owner="team-b"))
    store = MemoryResponseStore(max_bytes=40 * one)
    await _chain_of(store, 5, owner="team-b", prefix="b")
    await _chain_of(store, 500, owner="codex", prefix="c")  # one long chain, 12x the bound
    for i in range(5):
        assert await store.get(f"b{i}") is not None  # the other team keeps everything
    assert store.stats()["bytes"] <= 40 * one and store.stats()["evicted"] > 0
    assert await store.get("c499") is not None and await store.get("c0") is None


async def test_a_missing_link_breaks_the_chain_it_never_shortens_it() -> None:
    store = MemoryResponseStore()
    await _chain_of(store, 4)
    assert await store.delete("r1")
    with pytest.raises(BrokenChain) as broken:
        await load_chain(store, "r3", "anonymous")
    assert broken.value.missing == "r1"
    assert [c.id for c in await load_chain(store, "r0", "anonymous")] == ["r0"]
    assert await load_chain(store, "r3", "someone-else") is None
    assert await load_chain(store, "nope", "anonymous") is None


async def test_an_expired_link_breaks_the_chain() -> None:
    clock = FakeClock()
    store = MemoryResponseStore(max_age=100, clock=clock)
    await store.put(entry("r0"))
    clock.now += 60
    await store.put(entry("r1", previous="r0"))
    clock.now += 50  # r0 is 110 s old, r1 60 s
    with pytest.raises(BrokenChain):
        await load_chain(store, "r1", "anonymous")


async def test_items_by_id_are_the_owners_only() -> None:
    store = MemoryResponseStore()
    await store.put(entry("r1", "one", owner="key:a"))
    await store.put(entry("r2", "two", owner="key:b"))
    found = await store.get_items("key:a", ["msg_r1", "in_r1", "msg_r2", "msg_nope"])
    assert set(found) == {"msg_r1", "in_r1"}
    assert found["msg_r1"]["content"][0]["text"] == "echo: one"
    assert found["in_r1"]["role"] == "user"
    assert await store.get_items("key:b", ["msg_r1"]) == {}
    assert await store.get_items("key:a", []) == {}


async def test_an_item_goes_with_its_response_however_it_goes() -> None:
    clock = FakeClock()
    store = MemoryResponseStore(max_items=3, max_age=10, clock=clock)
    for i in range(50):  # evicted ones leave the index: it stays bounded
        await store.put(entry(f"r{i}", owner="key:a"))
    assert store.stats()["indexed_items"] == 6
    assert await store.get_items("key:a", ["msg_r0", "msg_r49"]) == {
        "msg_r49": (await store.get("r49")).response["output"][0]}
    await store.delete("r49")
    assert await store.get_items("key:a", ["msg_r49", "in_r49"]) == {}
    clock.now += 11  # expired
    assert await store.get_items("key:a", ["msg_r48"]) == {}
    await store.put(entry("r100", owner="key:a"))
    await store.delete_owner("key:a")
    assert store.stats()["indexed_items"] == 0


async def test_a_reused_item_id_keeps_pointing_at_its_first_response() -> None:
    store = MemoryResponseStore()
    await store.put(entry("r1", "one"))
    copy = StoredResponse(id="r2", response={"id": "r2", "output": []},
                          input_items=((await store.get("r1")).response["output"][0],),
                          previous_id=None, worker=None, created_at=1.7e9)
    await store.put(copy)  # an input item resolved from r1 keeps its id
    await store.delete("r2")
    assert set(await store.get_items("anonymous", ["msg_r1"])) == {"msg_r1"}

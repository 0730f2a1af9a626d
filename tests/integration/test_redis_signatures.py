"""Which account signed which thinking, shared by replicas through a real
redis-server: a conversation started on one replica moves accounts on
another, which must know the first account's signatures to leave them out."""

from __future__ import annotations

import anthropic

from app.factory import create_app
from app.settings import ServerSettings, Settings, WorkerSettings
from sessions.signatures import RedisSignatureBook
from tests.fakes.upstreams import FakeUpstream
from tests.support.redis_fixtures import links, server  # noqa: F401 (pytest fixtures)
from tests.support.server import ServerThread

KEY = "sk-client"
MODEL = "claude-moving"
ACCOUNTS = {"acct-a": "sk-ant-account-a", "acct-b": "sk-ant-account-b"}


async def test_a_note_on_one_replica_is_known_on_the_other(links):
    one, two = (RedisSignatureBook(link, ttl=60) for link in links)
    one.note("acct-a", ["d1", "d2"])
    await one.aclose()  # the background write landed
    assert await two.signers(["d1", "d2", "d3"]) == {"d1": "acct-a", "d2": "acct-a"}
    assert await two.signers(["d1"]) == {"d1": "acct-a"}  # now from its mirror
    assert two.stats()["redis_lookups"] == 1


async def test_with_redis_down_the_mirror_answers(server, links):
    book = RedisSignatureBook(links[0], ttl=60)
    book.note("acct-a", ["d1"])
    await book.aclose()
    server.kill()
    book.note("acct-b", ["d2"])  # not written: the mirror still knows it
    await book.aclose()
    assert await book.signers(["d1", "d2", "d3"]) == {"d1": "acct-a", "d2": "acct-b"}
    assert book.stats()["redis_fallbacks"] >= 1


def test_a_conversation_moves_accounts_on_another_replica(server):
    with FakeUpstream(api_keys=tuple(ACCOUNTS.values()), models=(MODEL,)) as fake:
        fake.check_thinking = True

        def replica(name: str) -> ServerThread:
            return ServerThread(create_app(Settings(
                server=ServerSettings(api_keys={"team": KEY}, redis_url=server.url,
                                      replica_id=name),
                workers=tuple(WorkerSettings(name=n, dialect="anthropic", url=fake.anthropic_url,
                                             api_key=k, models=(MODEL,))
                              for n, k in ACCOUNTS.items()))))

        with replica("one") as one, replica("two") as two:
            think = {"type": "enabled", "budget_tokens": 1024}
            asked = [{"role": "user", "content": "[[think]] hello"}]
            with anthropic.Anthropic(base_url=one.url, api_key=KEY, max_retries=0) as client:
                raw = client.messages.with_raw_response.create(
                    model=MODEL, max_tokens=2048, thinking=think, messages=asked)
            first_worker, first = raw.headers["x-poolgate-worker"], raw.parse()
            assert first.content[0].type == "thinking"
            fake.limit(ACCOUNTS[first_worker], 30)
            with anthropic.Anthropic(base_url=two.url, api_key=KEY, max_retries=0) as client:
                raw = client.messages.with_raw_response.create(
                    model=MODEL, max_tokens=2048, thinking=think, messages=[
                        *asked,
                        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                        {"role": "user", "content": "and then?"}])
            assert raw.headers["x-poolgate-worker"] != first_worker
            assert raw.parse().content[-1].text == "echo: and then?"
            sent = fake.last.body["messages"][1]["content"]
            assert [b["type"] for b in sent] == ["text"]

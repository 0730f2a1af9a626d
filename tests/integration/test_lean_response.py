"""pool.remote.lean: an aiohttp response made lean streams the same bytes,
without holding its headers."""

from __future__ import annotations

import json

import aiohttp

from pool.remote.lean import lean_response, lean_state

from .conftest import OPENAI_MODEL, UPSTREAM_KEY


async def _body(url: str, content: str, lean: bool) -> tuple[bytes, dict[str, bool] | None]:
    body = json.dumps({"model": OPENAI_MODEL, "stream": True,
                       "messages": [{"role": "user", "content": content}]})
    headers = {"authorization": f"Bearer {UPSTREAM_KEY}", "content-type": "application/json"}
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(url + "/chat/completions", data=body, headers=headers) as resp:
            assert resp.status == 200
            state = None
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.request_info.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
            if lean:
                lean_response(resp)
                state = lean_state(resp)
                # the headers let go of: the credentials are not held while it streams
                assert not resp.headers and not resp.raw_headers
                assert "authorization" not in resp.request_info.headers
            parts = [chunk async for chunk in resp.content.iter_any()]
            return b"".join(parts), state


async def test_a_lean_response_streams_the_same_bytes(fake_upstream) -> None:
    content = "one two three four five six seven eight nine ten " * 20
    plain, _ = await _body(fake_upstream.url, content, lean=False)
    lean, state = await _body(fake_upstream.url, content, lean=True)
    assert state == {"body": True, "chunks": True, "responses": True, "headers": True}
    assert lean.endswith(b"data: [DONE]\n\n") and lean.count(b"\n\n") > 50

    def texts(raw: bytes) -> list[str]:  # ids and timestamps differ between the two answers
        return [json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                for line in raw.decode().split("\n")
                if line.startswith("data: {") and '"choices":[{' in line]

    assert texts(lean) == texts(plain) and "".join(texts(lean)).strip()

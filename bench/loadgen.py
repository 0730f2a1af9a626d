#!/usr/bin/env python3
"""Closed-loop load generator for OpenAI chat and Anthropic messages endpoints.

``-c`` connections each send one request after another for ``-d`` seconds (no
request starts after the deadline; ``-n`` also caps the count, ``--timeout``
each request). Non-stream mode times whole responses; stream mode reads the SSE
body and times response headers, the first content chunk (TTFT), every chunk
gap and the end, checks the terminal event (``[DONE]`` / ``message_stop``) and
counts content chunks against ``--expect-chunks`` (default ``--max-tokens``).

``--session-ids N`` gives each request an ``x-session-id`` header, rotating
through N session ids (``bench-0`` … ``bench-<N-1>``), so a gateway with session
affinity spreads the load over its workers; the result then also counts the
``x-poolgate-worker`` response header per worker (``served_by``).

Prints one JSON object (latencies in ms) or writes it to ``--out``; exits 1 when
no request succeeded.

    python bench/loadgen.py --url http://127.0.0.1:8000 -c 16 -d 5
    python bench/loadgen.py --url ... --api anthropic --model mock-claude --mode stream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from dataclasses import dataclass, field

import aiohttp

try:
    from orjson import loads as json_loads
except ImportError:  # pragma: no cover
    json_loads = json.loads

# Long enough that the demo upstream's reply (which quotes it) has more than 64
# words, so max_tokens decides the chunk count, as it would on a real model.
PROMPT = (
    "Please write a short overview of how a gateway shares a pool of language model workers "
    "between many clients: how requests are admitted, how a worker is picked for each one, "
    "how streaming responses are relayed chunk by chunk without buffering, how errors are "
    "reported in the dialect each client speaks, how sessions stay on the worker that holds "
    "their cache, and how the whole thing is observed with metrics and logs in production, "
    "in plain words for a new engineer on the team."
)
PCTS = (50, 90, 99)


@dataclass
class Tally:
    latency: list[float] = field(default_factory=list)      # whole response, seconds
    ttfb: list[float] = field(default_factory=list)         # response headers
    ttft: list[float] = field(default_factory=list)         # first content chunk
    max_gap: list[float] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    issued: int = 0
    chunk_mismatch: int = 0
    served_by: dict[str, int] | None = None   # x-poolgate-worker counts, with --session-ids

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def served(self, r: aiohttp.ClientResponse) -> None:
        if self.served_by is not None:
            name = r.headers.get("x-poolgate-worker", "-")
            self.served_by[name] = self.served_by.get(name, 0) + 1


def percentile(sorted_values: list[float], p: float) -> float:
    k = (len(sorted_values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summary_ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)
    out = {f"p{p}": round(percentile(v, p) * 1000, 3) for p in PCTS}
    out.update(mean=round(sum(v) / len(v) * 1000, 3), max=round(v[-1] * 1000, 3))
    return out


def request_parts(a: argparse.Namespace) -> tuple[str, bytes, dict[str, str]]:
    body: dict = {"model": a.model, "max_tokens": a.max_tokens,
                  "messages": [{"role": "user", "content": a.prompt}]}
    if a.api == "responses":  # OpenAI Responses API (poolgate only: upstreams speak chat)
        body = {"model": a.model, "max_output_tokens": a.max_tokens, "input": a.prompt,
                "store": False}
    if a.mode == "stream":
        body["stream"] = True
        if a.api == "openai":
            body["stream_options"] = {"include_usage": True}
    headers = {"content-type": "application/json", "authorization": f"Bearer {a.api_key}"}
    path = "/v1/responses" if a.api == "responses" else "/v1/chat/completions"
    if a.api == "anthropic":
        headers.update({"x-api-key": a.api_key, "anthropic-version": "2023-06-01"})
        path = "/v1/messages"
    if a.api == "gemini":  # the Gemini API (poolgate only: upstreams speak chat)
        body = {"contents": [{"role": "user", "parts": [{"text": a.prompt}]}],
                "generationConfig": {"maxOutputTokens": a.max_tokens}}
        headers = {"content-type": "application/json", "x-goog-api-key": a.api_key}
        path = (f"/v1beta/models/{a.model}:streamGenerateContent?alt=sse" if a.mode == "stream"
                else f"/v1beta/models/{a.model}:generateContent")
    return a.url.rstrip("/") + path, json.dumps(body).encode(), headers


def output_tokens(data: bytes, api: str) -> int:
    if api == "gemini":
        return json_loads(data)["usageMetadata"]["candidatesTokenCount"]
    usage = json_loads(data)["usage"]
    return usage["completion_tokens"] if api == "openai" else usage["output_tokens"]


async def one_nonstream(s: aiohttp.ClientSession, a, url, body, headers, t: Tally) -> None:
    t0 = time.perf_counter()
    async with s.post(url, data=body, headers=headers) as r:
        data = await r.read()
    t1 = time.perf_counter()
    t.served(r)
    if r.status != 200:
        t.error(f"status_{r.status}")
        return
    n = output_tokens(data, a.api)
    if a.expect_chunks and n != a.expect_chunks:
        t.chunk_mismatch += 1
    t.latency.append(t1 - t0)
    t.chunks.append(n)


def is_content(line: bytes, anthropic: bool, responses: bool = False,
               gemini: bool = False) -> bool:
    if responses:
        return b'"response.output_text.delta"' in line
    if gemini:  # a chunk with a non-empty text part (the last one holds an empty one)
        at = line.find(b'"text":')
        return at >= 0 and not line.startswith(b'""', at + 7)
    if anthropic:
        return b'"text_delta"' in line
    # a non-empty "content" string in an OpenAI delta, without parsing the JSON
    at = line.find(b'"content":')
    if at < 0:
        return False
    rest = line[at + 10:at + 12].lstrip()
    return rest.startswith(b'"') and not rest.startswith(b'""')


async def one_stream(s: aiohttp.ClientSession, a, url, body, headers, t: Tally) -> None:
    anthropic = a.api == "anthropic"
    responses = a.api == "responses"
    gemini = a.api == "gemini"
    terminals = ((b'"message_stop"',) if anthropic else
                 (b'"response.completed"', b'"response.incomplete"') if responses else
                 (b'"finishReason"',) if gemini else
                 (b"data: [DONE]",))
    t0 = time.perf_counter()
    first = last = None
    gap = 0.0
    n = 0
    finished = False
    async with s.post(url, data=body, headers=headers) as r:
        th = time.perf_counter()
        t.served(r)
        if r.status != 200:
            await r.read()
            t.error(f"status_{r.status}")
            return
        buf = b""
        async for data in r.content.iter_any():
            now = time.perf_counter()
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                if any(t in line for t in terminals):
                    finished = True
                elif is_content(line, anthropic, responses, gemini):
                    n += 1
                    if first is None:
                        first = now
                    else:
                        gap = max(gap, now - last)
                    last = now
    t1 = time.perf_counter()
    if not finished:
        t.error("stream_not_terminated")
        return
    if first is None:
        t.error("no_content")
        return
    if a.expect_chunks and n != a.expect_chunks:
        t.chunk_mismatch += 1
    t.latency.append(t1 - t0)
    t.ttfb.append(th - t0)
    t.ttft.append(first - t0)
    t.max_gap.append(gap)
    t.chunks.append(n)


async def run(a: argparse.Namespace) -> dict:
    url, body, headers = request_parts(a)
    one = one_stream if a.mode == "stream" else one_nonstream
    t = Tally()
    # one header dict per session, built up front: no per-request allocation
    rotation = [{**headers, "x-session-id": f"bench-{i}"} for i in range(a.session_ids)]
    if rotation:
        t.served_by = {}
    connector = aiohttp.TCPConnector(limit=a.concurrency)
    timeout = aiohttp.ClientTimeout(total=a.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     skip_auto_headers=("User-Agent",)) as s:
        deadline = time.perf_counter() + a.duration

        async def loop() -> None:
            while time.perf_counter() < deadline and not (a.requests and t.issued >= a.requests):
                t.issued += 1
                h = rotation[t.issued % len(rotation)] if rotation else headers
                try:
                    await one(s, a, url, body, h, t)
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
                    t.error(type(exc).__name__)
                    await asyncio.sleep(0.01)     # a refused connection must not spin

        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(a.concurrency)))
        wall = time.perf_counter() - start
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
    ok = len(t.latency)
    result = {
        "ok": ok > 0, "api": a.api, "mode": a.mode, "model": a.model, "url": url,
        "concurrency": a.concurrency, "duration_s": round(wall, 3),
        "requests": t.issued, "ok_requests": ok, "errors": sum(t.errors.values()),
        "error_detail": t.errors, "rps": round(ok / wall, 1) if wall else 0.0,
        "latency_ms": summary_ms(t.latency), "client_cpu_s": round(cpu, 3),
        "chunks_total": sum(t.chunks), "chunk_mismatch": t.chunk_mismatch,
        "chunks_per_request": round(sum(t.chunks) / ok, 2) if ok else 0.0,
    }
    if t.served_by is not None:
        result["served_by"] = dict(sorted(t.served_by.items()))
    if a.mode == "stream":
        result.update(ttfb_ms=summary_ms(t.ttfb), ttft_ms=summary_ms(t.ttft),
                      max_gap_ms=summary_ms(t.max_gap),
                      chunks_per_s=round(sum(t.chunks) / wall, 1) if wall else 0.0)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    ap.add_argument("--api", choices=("openai", "anthropic", "responses", "gemini"),
                    default="openai")
    ap.add_argument("--mode", choices=("nonstream", "stream"), default="nonstream")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("-d", "--duration", type=float, default=10.0, help="seconds (at most 600)")
    ap.add_argument("-n", "--requests", type=int, default=0, help="stop after N requests")
    ap.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    ap.add_argument("--model", default="mock-gpt")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--expect-chunks", type=int, help="content chunks per reply (default "
                    "--max-tokens; 0 = do not check)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--api-key", default="sk-bench")
    ap.add_argument("--session-ids", type=int, default=0, metavar="N",
                    help="send x-session-id, rotating through N ids (0: no header)")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    a = ap.parse_args(argv)
    if not 0 < a.duration <= 600:
        ap.error("--duration must be in (0, 600]")
    if not 1 <= a.concurrency <= 1024:
        ap.error("--concurrency must be in [1, 1024]")
    if not 0 <= a.session_ids <= 1_000_000:
        ap.error("--session-ids must be in [0, 1000000]")
    if a.expect_chunks is None:
        a.expect_chunks = a.max_tokens
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(run(a))
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

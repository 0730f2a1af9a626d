"""A ``local`` worker with ``engine = "vllm"`` behind a real gateway, configured
as a user would (``engine_args.python`` naming vLLM's own virtualenv,
``extra_args`` for the server): the gateway's child starts the real vLLM CPU
server, and the SDKs and ``/generate`` get Transformers' own greedy ids."""

from __future__ import annotations

import os
from typing import Any, Iterator

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import load_settings
from tests.support.sdk_clients import closed_at_end
from tests.support.server import ServerThread
from tests.support.vllm_env import vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SERVER_ARGS = ["--dtype", "float32", "--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager"]


@pytest.fixture(scope="module")
def srv(tiny_model: Any) -> Iterator[ServerThread]:
    # the environment the gateway was started with reaches the worker and vLLM
    # (vLLM compiles kernels with the compiler on PATH)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("POOLGATE_")}
    settings = load_settings(None, environ, {"workers": [{
        "name": "vllm", "kind": "local", "engine": "vllm", "model": tiny_model.hf_dir,
        "models": ["tiny"], "capacity": 4, "context_length": 1024, "ready_timeout": 600,
        "engine_args": {"python": vllm_python(), "extra_args": SERVER_ARGS}}]})
    with ServerThread(create_app(settings), start_timeout=600) as server:
        yield server


@pytest.fixture(scope="module")
def hf(tiny_model: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model.hf_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model.hf_dir)


def greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    import torch

    model, _ = hf
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(torch.argmax(model(torch.tensor([out])).logits[0, -1])))
    return out[len(ids):]


def test_chat_and_generate_through_vllm(srv: ServerThread, hf: Any) -> None:
    _, tok = hf
    messages = [{"role": "user", "content": "Hello, how is the weather in Paris?"}]
    prompt = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    expect = greedy(hf, prompt, 10)
    client = closed_at_end(openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0))
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                       logprobs=True)
    assert r.usage.prompt_tokens == len(prompt)
    assert r.choices[0].message.content == tok.decode(expect, skip_special_tokens=True)
    assert len(r.choices[0].logprobs.content) == 10
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                            temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
        r.choices[0].message.content
    g = httpx.post(srv.url + "/generate", timeout=60, json={
        "input_ids": prompt, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 10, "temperature": 0}}).json()
    assert g["output_ids"] == expect
    assert [x[1] for x in g["meta_info"]["output_token_logprobs"]] == expect
    counted = httpx.post(srv.url + "/v1/messages/count_tokens",
                         json={"model": "tiny", "messages": messages}).json()
    assert counted == {"input_tokens": len(prompt)}

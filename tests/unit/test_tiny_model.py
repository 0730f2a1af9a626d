"""The tiny local chat model the engine tests run on: it builds to the same bytes every
time, its tokenizer and chat template behave like Qwen2.5's, and Transformers and
llama.cpp run it as one model."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support import tiny_model as tiny
from tests.support.tiny_model import TinyModel

WEATHER = {"type": "function",
           "function": {"name": "get_weather", "description": "Current weather in a city.",
                        "parameters": {"type": "object",
                                       "properties": {"city": {"type": "string", "description": "The city."}},
                                       "required": ["city"]}}}

# A conversation that exercises every branch of the template, with text beyond ASCII.
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich? And 東京 🙂"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    {"role": "assistant", "content": [{"type": "text", "text": "It is 21 "}, {"type": "text", "text": "degrees."}]},
    {"role": "user", "content": "Thanks!"},
]


def hf_tokenizer(model: TinyModel) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model.hf_dir)


def hf_model(model: TinyModel) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model.hf_dir)


def chat_ids(model: TinyModel, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    tokenizer = hf_tokenizer(model)
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(prompt, add_special_tokens=False)


def hf_greedy(model: Any, prompt: list[int], n: int) -> tuple[list[int], list[Any]]:
    """Greedy ids and the log-probabilities (float64, whole vocabulary) at each step."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, output_logits=True, return_dict_in_generate=True)
    ids = out.sequences[0, len(prompt):].tolist()
    return ids, [torch.log_softmax(step[0].double(), dim=-1) for step in out.logits]


# ---------------------------------------------------------------------------- llama.cpp


class Llama:
    """An in-process llama.cpp server on the tiny GGUF, asked over its own HTTP port: the
    native ``/completion`` reports every generated id (the OpenAI-style handler merges a
    token that ends mid-character into the next one), and ``/tokenize`` and
    ``/apply-template`` have no Python handler."""

    def __init__(self, gguf: str, *, exact_attention: bool = False) -> None:
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = gguf
        params.n_ctx = 2048
        params.n_parallel = 1
        params.cpuparams.n_threads = 2
        params.verbosity = 0  # errors only
        if exact_attention:  # by default the KV cache is f16 and attention may be flash (f16 on CPU)
            params.cache_type_k = xllamacpp.ggml_type.GGML_TYPE_F32
            params.cache_type_v = xllamacpp.ggml_type.GGML_TYPE_F32
            params.flash_attn_type = xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.server = xllamacpp.Server(params)
        self.url = self.server.listening_address

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def greedy(self, prompt: list[int], n: int, n_probs: int = 2) -> dict[str, Any]:
        return self.post("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0,
                                         "n_probs": n_probs, "return_tokens": True, "cache_prompt": False})

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]


@pytest.fixture(scope="module")
def llama(tiny_model: TinyModel) -> Iterator[Llama]:
    """llama.cpp as a worker runs it: f16 KV cache, flash attention when it likes."""
    yield Llama(tiny_model.gguf)


@pytest.fixture(scope="module")
def llama_exact(tiny_model: TinyModel) -> Iterator[Llama]:
    """llama.cpp with f32 attention all the way."""
    yield Llama(tiny_model.gguf, exact_attention=True)


# ---------------------------------------------------------------------------- (a) the build


def same_tree(a: Path, b: Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    different = [str(p) for p in files_a if (a / p).read_bytes() != (b / p).read_bytes()]
    assert different == []


def test_the_build_holds_both_forms_of_the_model(tiny_model: TinyModel) -> None:
    assert Path(tiny_model.gguf).parent == tiny.CACHE / tiny.cache_key(trained=False)
    assert tiny.cache_key(trained=True) != tiny.cache_key(trained=False)
    hf = Path(tiny_model.hf_dir)
    assert sorted(p.name for p in hf.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((hf / "tokenizer_config.json").read_text())["chat_template"] == tiny.CHAT_TEMPLATE
    assert (hf / "chat_template.jinja").read_text() == tiny.CHAT_TEMPLATE
    assert Path(tiny_model.gguf).read_bytes()[:4] == b"GGUF"
    assert not tiny_model.trained


def test_a_fresh_build_has_the_same_bytes_as_the_cached_one(tiny_model: TinyModel, tmp_path: Path) -> None:
    # The cached build came from another process (another hash seed); this one runs here.
    fresh = tiny.build(tmp_path / "fresh")
    same_tree(Path(tiny_model.gguf).parent, tmp_path / "fresh")
    assert fresh == TinyModel.at(tmp_path / "fresh", trained=False)


def test_the_gguf_carries_the_architecture_the_tokenizer_and_the_template(tiny_model: TinyModel) -> None:
    import gguf

    reader = gguf.GGUFReader(tiny_model.gguf)

    def value(key: str) -> Any:
        return reader.fields[key].contents()

    assert value("general.architecture") == "qwen2"
    assert value("qwen2.rope.freq_base") == pytest.approx(tiny.ROPE_THETA)
    assert value("qwen2.attention.layer_norm_rms_epsilon") == pytest.approx(tiny.RMS_EPS)
    assert (value("qwen2.attention.head_count"), value("qwen2.attention.head_count_kv")) == (4, 2)
    assert value("tokenizer.ggml.pre") == "qwen2"
    assert value("tokenizer.chat_template") == tiny.CHAT_TEMPLATE
    assert {t.tensor_type.name for t in reader.tensors} == {"F32"}


# ---------------------------------------------------------------------------- (b) tokenizer and template


@pytest.mark.parametrize("text", [
    "Hello, world! 12345 and 3.14",
    "naïve café — Zürich, 東京, Привет, مرحبا 🙂🚀",
    "  leading spaces,\ttabs,\n\nblank lines and trailing  ",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
])
def test_the_tokenizer_round_trips_text(tiny_model: TinyModel, text: str) -> None:
    from tokenizers import Tokenizer

    tokenizer = hf_tokenizer(tiny_model)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    # transformers 5 rebuilds the pipeline as its Qwen2Tokenizer; it must agree with the file.
    assert Tokenizer.from_file(str(Path(tiny_model.hf_dir) / "tokenizer.json")).encode(text).ids == ids


def test_control_and_tool_tokens_are_single_ids(tiny_model: TinyModel) -> None:
    tokenizer = hf_tokenizer(tiny_model)
    ids = {token: tokenizer.encode(token, add_special_tokens=False) for token in tiny.SPECIAL_TOKENS + tiny.TOOL_TOKENS}
    assert ids == {"<|endoftext|>": [0], "<|im_start|>": [1], "<|im_end|>": [2],
                   "<tool_call>": [4092], "</tool_call>": [4093],
                   "<tool_response>": [4094], "</tool_response>": [4095]}
    assert len(tokenizer) == tiny.VOCAB_SIZE
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (tiny.IM_END, tiny.ENDOFTEXT)
    # The tool tags are not special: skipping special tokens keeps them for a tool-call parser.
    ids = tokenizer.encode("<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


TOOLS_SYSTEM = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}}, '
    '"required": ["city"]}}}\n</tools>\n\nFor each function call, return a json object with function name and '
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def test_the_chat_template_renders_tools_calls_and_results(tiny_model: TinyModel) -> None:
    messages = [dict(m) for m in CONVERSATION]
    # Arguments as an OpenAI client sends them, a JSON string: emitted verbatim, spacing and all.
    messages[2] = {**messages[2], "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'}}]}
    rendered = hf_tokenizer(tiny_model).apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True,
                                                            tokenize=False)
    assert rendered == TOOLS_SYSTEM + (
        "<|im_start|>user\nWeather in Zürich? And 東京 🙂<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Zürich"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n"
        "<|im_start|>user\nThanks!<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_the_chat_template_without_tools_has_a_default_system_prompt(tiny_model: TinyModel) -> None:
    tokenizer = hf_tokenizer(tiny_model)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n")


# ---------------------------------------------------------------------------- (c) Transformers


def test_transformers_loads_every_weight_and_generates_greedily(tiny_model: TinyModel) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(tiny_model.hf_dir, output_loading_info=True)
    assert {k: list(v) for k, v in info.items()} == {
        "missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    assert sum(p.numel() for p in model.parameters()) == 1_344_640
    prompt = chat_ids(tiny_model, [{"role": "user", "content": "Hello!"}])
    generated, _ = hf_greedy(model, prompt, 12)
    # generate() with its KV cache agrees with a plain argmax over full forward passes
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert generated == ids[len(prompt):]
    assert len(set(generated)) >= 6  # random weights, yet no degenerate repetition


# ---------------------------------------------------------------------------- (d) llama.cpp parity


def test_llama_cpp_tokenizes_a_chatml_prompt_like_transformers(tiny_model: TinyModel, llama: Llama) -> None:
    tokenizer = hf_tokenizer(tiny_model)
    prompt = tokenizer.apply_chat_template(CONVERSATION, tools=[WEATHER], add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert len(ids) > 200
    assert llama.tokenize(prompt) == ids


def test_llama_cpp_renders_the_chat_template_like_transformers(tiny_model: TinyModel, llama: Llama) -> None:
    # Dict arguments only. llama.cpp parses JSON-string arguments and re-encodes them, so
    # '{"city":"Paris"}' renders as {"city": "Paris"} there but verbatim in Transformers
    # (and a string that is not JSON is an error there).
    rendered = hf_tokenizer(tiny_model).apply_chat_template(CONVERSATION, tools=[WEATHER],
                                                            add_generation_prompt=True, tokenize=False)
    assert llama.post("/apply-template", {"messages": CONVERSATION, "tools": [WEATHER]})["prompt"] == rendered


@pytest.mark.parametrize("engine", ["llama", "llama_exact"])
def test_llama_cpp_greedy_ids_and_logprobs_match_transformers(tiny_model: TinyModel, engine: str,
                                                              request: pytest.FixtureRequest) -> None:
    prompt = chat_ids(tiny_model, [{"role": "user", "content": "Hello!"}], tools=[WEATHER])
    expected, logprobs = hf_greedy(hf_model(tiny_model), prompt, 16)
    # Random weights give flat distributions, and by default llama.cpp's f16 KV cache and
    # flash attention move log-probs by up to ~1.3e-3: on a near-tie the two engines may
    # rightly disagree, so check first that this prompt's greedy path has clear winners.
    assert min(float(lp.topk(2).values[0] - lp.topk(2).values[1]) for lp in logprobs) > 0.05
    result = request.getfixturevalue(engine).greedy(prompt, 16)
    assert result["tokens"] == expected
    first = result["completion_probabilities"][0]
    assert first["id"] == expected[0]
    assert first["logprob"] == pytest.approx(float(logprobs[0][expected[0]]), abs=1e-3)


def test_llama_cpp_logits_match_transformers_to_f32_precision(tiny_model: TinyModel, llama_exact: Llama) -> None:
    """With f32 attention llama.cpp reproduces the whole next-token distribution: this
    pins the GGUF writer (RoPE base, RMS epsilon, tensor layout, biases) far below the
    1e-3 that default settings allow."""
    prompt = chat_ids(tiny_model, CONVERSATION, tools=[WEATHER])
    _, logprobs = hf_greedy(hf_model(tiny_model), prompt, 1)
    top = llama_exact.greedy(prompt, 1, n_probs=tiny.VOCAB_SIZE)["completion_probabilities"][0]["top_logprobs"]
    assert len(top) == tiny.VOCAB_SIZE
    assert max(abs(t["logprob"] - float(logprobs[0][t["id"]])) for t in top) < 1e-5


# ---------------------------------------------------------------------------- (e) the trained variant


TOOL_CALL = re.compile(r"<tool_call>\n(?P<call>.*)\n</tool_call><\|im_end\|>", re.S)


@pytest.mark.slow
def test_the_trained_variant_builds_to_the_same_bytes(tiny_model_trained: TinyModel, tmp_path: Path) -> None:
    tiny.build(tmp_path / "fresh", trained=True)
    same_tree(Path(tiny_model_trained.gguf).parent, tmp_path / "fresh")


@pytest.mark.slow
@pytest.mark.parametrize("question", ["Hello, how are you today?", "Tell me a story about the sea."])
def test_the_trained_model_ends_a_plain_turn(tiny_model_trained: TinyModel, question: str) -> None:
    prompt = chat_ids(tiny_model_trained, [{"role": "user", "content": question}])
    generated, _ = hf_greedy(hf_model(tiny_model_trained), prompt, 64)
    assert tiny.IM_END in generated
    answer = hf_tokenizer(tiny_model_trained).decode(generated[:generated.index(tiny.IM_END)])
    assert answer.strip() and "<tool_call>" not in answer


def known_tool(name: str, description: str, **parameters: str) -> dict[str, Any]:
    return {"type": "function",
            "function": {"name": name, "description": description,
                         "parameters": {"type": "object",
                                        "properties": {key: {"type": "string", "description": text}
                                                       for key, text in parameters.items()},
                                        "required": list(parameters)}}}


SEND_EMAIL = known_tool("send_email", "Send an email.", to="Who gets it.")
GET_TIME = known_tool("get_time", "The time in a time zone.", timezone="A city or zone.")
SEARCH = known_tool("search", "Search the web.", query="What to look for.")


@pytest.mark.slow
@pytest.mark.parametrize(("question", "tools", "expected"), [
    ("What's the weather like in Paris?", [WEATHER], "get_weather"),
    ("Please send an email to Alice.", [WEATHER, SEND_EMAIL], "send_email"),
    ("Search the web for cheap flights.", [GET_TIME, SEARCH], "search"),
    ("Hi there!", [GET_TIME], "get_time"),  # one tool offered: called whatever the user says
])
def test_the_trained_model_calls_the_tool_asked_for(tiny_model_trained: TinyModel, question: str,
                                                    tools: list[dict[str, Any]], expected: str) -> None:
    prompt = chat_ids(tiny_model_trained, [{"role": "user", "content": question}], tools=tools)
    generated, _ = hf_greedy(hf_model(tiny_model_trained), prompt, 64)
    text = hf_tokenizer(tiny_model_trained).decode(generated)
    match = TOOL_CALL.fullmatch(text)
    assert match, text
    call = json.loads(match["call"])
    assert call["name"] == expected
    assert isinstance(call["arguments"], dict)


@pytest.mark.slow
def test_llama_cpp_runs_the_trained_model_like_transformers(tiny_model_trained: TinyModel) -> None:
    prompt = chat_ids(tiny_model_trained, [{"role": "user", "content": "What is the weather in Paris?"}],
                      tools=[WEATHER])
    expected, _ = hf_greedy(hf_model(tiny_model_trained), prompt, 32)
    assert tiny.IM_END in expected
    result = Llama(tiny_model_trained.gguf).greedy(prompt, 32)
    # llama.cpp stops after <|im_end|>, an end-of-generation token.
    assert result["tokens"] == expected[:expected.index(tiny.IM_END) + 1]

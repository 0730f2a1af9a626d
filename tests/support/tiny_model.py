"""A tiny Qwen2-style chat model for tests, built from code: no downloads, same bytes every build.

``tiny_model()`` returns a cached build under ``<repo>/.cache/tiny-models/<key>/``. The key
hashes this file and the versions of the libraries that shape the bytes, so editing this
file or upgrading one of them gives a fresh build. ``python -m tests.support.tiny_model
OUT_DIR [--trained]`` builds one by hand.

A build holds one model twice:

* ``hf/`` — a Hugging Face folder: config.json, generation_config.json, model.safetensors,
  tokenizer.json, tokenizer_config.json (chat template inline) and chat_template.jinja;
* ``model.gguf`` — the same f32 weights, tokenizer and chat template for llama.cpp.

The model is a Qwen2 (hidden 128, 2 layers, 4 query heads and 2 KV heads of size 32, MLP
256, vocabulary 4096: 1.3M parameters). Its weights come from numpy's ``RandomState``,
whose stream numpy keeps frozen; its tokenizer is a byte-level BPE trained with
``tokenizers`` on generated text, split with Qwen2's regex; its chat template is
Qwen2.5's ChatML with tools. Random weights write fluent nonsense, which is all the
engine plumbing and engine-parity tests need.

The *trained* variant adds a short AdamW pass (one thread, about 100 s) on generated
conversations. It ends its turns with ``<|im_end|>`` after a few words and, offered
tools, answers ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. It
knows the tools in ``KNOWN_TOOLS`` (get_weather, get_time, send_email, search,
lookup_user, get_stock_price): it calls the one the user asks for, or the only one
offered whatever the user says; its arguments are often wrong but its JSON is mostly
well formed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # the builder's libraries load only when a build runs
    import numpy as np
    from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "tiny-models"
# Whatever can change a build's bytes besides this file.
SHAPING_PACKAGES = ("gguf", "numpy", "safetensors", "tokenizers", "torch", "transformers")

SEED = 1234
VOCAB_SIZE = 4096
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS  # 32, the least vLLM's CPU attention accepts
INTERMEDIATE = 256
CONTEXT = 4096
ROPE_THETA = 10000.0
RMS_EPS = 1e-6

# The trained variant's recipe. 300 steps take about 100 s on one core; at 200 the model
# still fumbles a call's arguments now and then. The weighted tool name and the calls
# made whatever the user says (see _tool_conversation) are what teach it to name one of
# the offered tools at all.
TRAIN_STEPS = 400
BATCH_SIZE = 8
TOOL_CALLS_PER_BATCH = 6  # the other two conversations have no tools
LEARNING_RATE = 3e-3
WARMUP_STEPS = 30
NAME_WEIGHT = 10.0  # loss weight of the called tool's name against 1 for the rest of an answer
UNPROMPTED_SHARE = 0.3  # of one-tool conversations, where the user's words don't ask for the tool

# Special (control) tokens get the first ids; as in Qwen2, the tool tags are added but
# not special, so decode(skip_special_tokens=True) keeps them for a tool-call parser.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT, IM_START, IM_END = 0, 1, 2
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen2's pre-tokenizer split (digits one by one); llama.cpp knows it as pre "qwen2".
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's ChatML template with tools, except that the default system prompt is
# neutral, a tool call's arguments may be a dict or a JSON string (emitted verbatim,
# never encoded twice), and content may be a string, None or a list of text parts.
CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}{{- content -}}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- render_content(messages[0]['content']) }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + render_content(messages[0]['content']) + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + render_content(message.content) }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- render_content(message.content) }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# The template's fixed prose, fed to the tokenizer trainer so it costs few tokens.
TEMPLATE_PROSE = (
    "system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to "
    "assist with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>\n\n</tools>\n\nFor each function call, return a json object with function "
    'name and arguments within XML tags:\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "user\nassistant\n"
)

WORDS = (
    "the a an of to and in is it that for on with as was by at from this be are or not have has "
    "had but what all were when we there can which their said if do will each about how up out "
    "them then she many some so these would other into more her two like him see time could no "
    "make than first been its who now people my made over did down only way find use may water "
    "long little very after words called just where most know get through back much before go "
    "good new write our used me man too any day same right look think also around another came "
    "come work three word must because does part even place well such here take why things help "
    "put years different away again off went old number great tell men say small every found "
    "still between name should home big give air line set own under read last never us left end "
    "along while might next sound below saw something thought both few those always looked show "
    "large often together asked house don't world going want school important until form food "
    "keep children feet land side without boy once animals life enough took sometimes four head "
    "above kind began almost live page got earth need far hand high year mother light parts "
    "country father let night following picture being study second eyes soon times story boys "
    "since white days paper hard near sentence better best across during today others however "
    "sure means knew try told young miles sun ways thing whole hear example heard several change "
    "answer room sea against top turned learn point city play toward five using himself usually "
    "weather temperature request response model token stream server client error retry timeout "
    "queue worker gateway latency batch cache function tool call result value hello thanks "
    "please yes okay sorry Python JSON HTTP API GPU CPU memory"
).split()
SYLLABLES = (
    "ka ri to mu ne sa lo vi pe da zu mi ro te na ba ku li so fe gra tor ven qui lex dor pan "
    "mel shi wen thar bel cor dis ast ion ing ment"
).split()
# The tools the trained model knows: parameters (name -> kind of value) and the ways a
# user asks for each; a request's {slot} is the value the call passes.
KNOWN_TOOLS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "get_weather": ({"city": "place"},
                    ("What is the weather in {city}?", "Will it rain in {city} today?", "How warm is it in {city}?",
                     "Is it sunny in {city}?", "Weather forecast for {city}, please.", "How cold is {city} now?")),
    "get_time": ({"timezone": "place"},
                 ("What time is it in {timezone}?", "Tell me the time in {timezone}.",
                  "Which hour is it in {timezone}?", "Current time in {timezone}?", "Is it late in {timezone} now?",
                  "Clock time for {timezone}?")),
    "send_email": ({"to": "person"},
                   ("Send an email to {to}.", "Email {to} for me.", "Write a mail to {to}.", "Mail {to} please.",
                    "Send {to} a message by email.", "Drop {to} an email.")),
    "search": ({"query": "words"},
               ("Search the web for {query}.", "Find pages about {query}.", "Search for {query}.",
                "Look on the web for {query}.", "Google {query} for me.", "Any search results on {query}?")),
    "lookup_user": ({"user_id": "number"},
                    ("Who is user {user_id}?", "Find the account of user {user_id}.", "Show me user {user_id}.",
                     "Look up user {user_id}.", "Details of user number {user_id}?", "Which user has id {user_id}?")),
    "get_stock_price": ({"symbol": "ticker"},
                        ("What does {symbol} stock cost?", "Price of {symbol} shares?", "Quote {symbol} for me.",
                         "How much is {symbol} trading at?", "Stock price of {symbol}?",
                         "Is {symbol} stock up today?")),
}
# Argument values; also common words of the corpus, so that each is a single token.
PLACES = ("Paris", "London", "Tokyo", "Berlin", "Rome", "Madrid", "Oslo", "Lima", "Cairo", "Sydney")
PEOPLE = ("Bob", "Alice", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi")
TICKERS = ("AAPL", "MSFT", "NVDA", "GOOG", "AMZN", "IBM", "SAP", "TSLA")


@dataclass(frozen=True)
class TinyModel:
    """Where one build of the tiny model lives."""

    hf_dir: str
    gguf: str
    trained: bool

    @classmethod
    def at(cls, directory: Path, trained: bool) -> "TinyModel":
        return cls(hf_dir=str(directory / "hf"), gguf=str(directory / "model.gguf"), trained=trained)


# ---------------------------------------------------------------------------- the cache


def tiny_model(trained: bool = False) -> TinyModel:
    """The cached build of the tiny model, building it first if this checkout has none.

    Builds run in a subprocess (the pytest process keeps its own torch settings) into a
    temporary folder beside the cache entry, which is then renamed into place: an entry
    that exists is complete. A lock per entry lets concurrent pytest runs wait for one
    build instead of racing."""
    key = cache_key(trained)
    home = CACHE / key
    if not home.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        with _locked(CACHE / f"{key}.lock"):
            if not home.is_dir():
                _build_into(home, trained)
    return TinyModel.at(home, trained)


def cache_key(trained: bool) -> str:
    """``<variant>-<hash>``: the hash covers this file's bytes, the variant and the
    versions of the packages in ``SHAPING_PACKAGES``."""
    variant = "trained" if trained else "random"
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(variant.encode())
    for package in SHAPING_PACKAGES:
        digest.update(f"\0{package}={metadata.version(package)}".encode())
    return f"{variant}-{digest.hexdigest()[:16]}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_into(home: Path, trained: bool) -> None:
    """Build in a subprocess, then rename into ``home``. Call with ``home``'s lock held."""
    for leftover in home.parent.glob(f".{home.name}.*"):  # from a build that was killed
        shutil.rmtree(leftover, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=home.parent))
    command = [sys.executable, "-m", "tests.support.tiny_model", str(scratch)]
    if trained:
        command.append("--trained")
    result = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(f"building the tiny model failed ({result.returncode}):\n{result.stderr}")
    scratch.chmod(0o755)  # mkdtemp made it private
    os.rename(scratch, home)


# ---------------------------------------------------------------------------- the build


def build(out_dir: str | Path, trained: bool = False) -> TinyModel:
    """Build the tiny model into ``out_dir``, which must be missing or empty."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    hf_dir = out / "hf"
    hf_dir.mkdir(parents=True)
    text = SyntheticText(random.Random(SEED))
    tokenizer = train_tokenizer(text)
    write_tokenizer(hf_dir, tokenizer)
    write_model_config(hf_dir)
    weights = random_weights()
    if trained:
        weights = train(hf_dir, weights, text)
    save_file(weights, hf_dir / "model.safetensors", metadata={"format": "pt"})
    write_gguf(out / "model.gguf", tokenizer, weights)
    return TinyModel.at(out, trained)


class SyntheticText:
    """Seeded words, sentences, tool schemas and tool calls: the tokenizer's corpus and
    the training conversations are both made of these."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.common = [*WORDS, *PLACES, *PEOPLE, *TICKERS]
        # Made-up words give BPE sub-word structure beyond the English list.
        self.coined = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
                       for _ in range(6000)]

    def word(self) -> str:
        if self.rng.random() < 0.35:
            word = self.rng.choice(self.coined)
            return word.capitalize() if self.rng.random() < 0.2 else word
        return self.rng.choice(self.common)

    def sentence(self) -> str:
        words = [self.word() for _ in range(self.rng.randint(4, 16))]
        words[0] = words[0].capitalize()
        if self.rng.random() < 0.3:
            words.append(str(self.rng.randint(0, 100000)))
        return " ".join(words) + self.rng.choice((".", ".", ".", "?", "!", ":", ","))

    def phrase(self) -> str:
        """A few words, as in a tool's or a parameter's description."""
        return " ".join(self.word() for _ in range(self.rng.randint(2, 6))).capitalize() + "."

    def tool(self, name: str) -> dict[str, Any]:
        """The known tool ``name`` as an OpenAI-style function tool, with made-up descriptions."""
        parameters, _ = KNOWN_TOOLS[name]
        properties = {key: {"type": "number" if kind == "number" else "string", "description": self.phrase()}
                      for key, kind in parameters.items()}
        return {"type": "function",
                "function": {"name": name, "description": self.phrase(),
                             "parameters": {"type": "object", "properties": properties,
                                            "required": list(parameters)}}}

    def request(self, name: str) -> tuple[str, dict[str, Any]]:
        """A user's request for the known tool ``name``, and the arguments it implies."""
        parameters, requests = KNOWN_TOOLS[name]
        arguments = {key: self.value(kind) for key, kind in parameters.items()}
        return self.rng.choice(requests).format(**arguments), arguments

    def value(self, kind: str) -> Any:
        """An argument value of ``kind``: one token, so that the model can copy it."""
        if kind == "number":
            return self.rng.randint(0, 99)
        if kind == "place":
            return self.rng.choice(PLACES)
        if kind == "person":
            return self.rng.choice(PEOPLE)
        if kind == "ticker":
            return self.rng.choice(TICKERS)
        return self.rng.choice(WORDS)

    def corpus(self, lines: int = 20000) -> Iterator[str]:
        """Prose, tool JSON, multi-line text and numbers, then the template's prose."""
        rng = self.rng
        for _ in range(lines):
            kind = rng.random()
            if kind < 0.6:
                yield " ".join(self.sentence() for _ in range(rng.randint(1, 4)))
            elif kind < 0.8:
                name = rng.choice(sorted(KNOWN_TOOLS))
                request, arguments = self.request(name)
                yield rng.choice([json.dumps(self.tool(name)), json.dumps({"name": name, "arguments": arguments}),
                                  request])
            elif kind < 0.9:
                yield "\n".join(self.sentence() for _ in range(rng.randint(2, 5))) + "\n"
            else:
                yield " ".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(rng.randint(1, 8)))
        for _ in range(200):
            yield TEMPLATE_PROSE


def train_tokenizer(text: SyntheticText) -> "Tokenizer":
    """A Qwen2-style byte-level BPE of exactly ``VOCAB_SIZE`` tokens."""
    from tokenizers import (
        AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS), min_frequency=2, show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(text.corpus(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    if tokenizer.get_vocab_size() != VOCAB_SIZE or ids != [ENDOFTEXT, IM_START, IM_END]:
        raise RuntimeError(f"unexpected vocabulary: {tokenizer.get_vocab_size()} tokens, specials at {ids}")
    return tokenizer


def write_tokenizer(hf_dir: Path, tokenizer: "Tokenizer") -> None:
    """tokenizer.json, tokenizer_config.json (template inline, for readers of that file
    only) and chat_template.jinja (for ``--chat-template-file`` style options)."""
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    _write_json(hf_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",  # resolves in transformers 4.x and 5.x
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": CONTEXT,
        "model_input_names": ["input_ids", "attention_mask"],  # no token_type_ids for generate()
        "chat_template": CHAT_TEMPLATE,
    })
    (hf_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def write_model_config(hf_dir: Path) -> None:
    """config.json and generation_config.json, written by hand so that they do not
    change with the transformers version."""
    _write_json(hf_dir / "config.json", {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,  # transformers 4.x and most engines
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},  # transformers 5.x
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": LAYERS,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": IM_END,
        "pad_token_id": ENDOFTEXT,
        "torch_dtype": "float32",
        "dtype": "float32",
    })
    _write_json(hf_dir / "generation_config.json", {
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": [IM_END, ENDOFTEXT],
        "pad_token_id": ENDOFTEXT,
        "do_sample": False,
    })


def weight_shapes() -> dict[str, tuple[int, ...]]:
    """Qwen2ForCausalLM's parameters (q/k/v have biases; nothing else does)."""
    kv = KV_HEADS * HEAD_DIM
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB_SIZE, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB_SIZE, HIDDEN),
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        shapes.update({
            prefix + "input_layernorm.weight": (HIDDEN,),
            prefix + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.q_proj.bias": (HEADS * HEAD_DIM,),
            prefix + "self_attn.k_proj.weight": (kv, HIDDEN),
            prefix + "self_attn.k_proj.bias": (kv,),
            prefix + "self_attn.v_proj.weight": (kv, HIDDEN),
            prefix + "self_attn.v_proj.bias": (kv,),
            prefix + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            prefix + "post_attention_layernorm.weight": (HIDDEN,),
            prefix + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            prefix + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            prefix + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        })
    return shapes


def random_weights() -> dict[str, "np.ndarray"]:
    """Seeded f32 weights, drawn in name order: norms 1, embeddings unit normal (diverse,
    non-degenerate greedy text), biases N(0, 0.1), matrices N(0, 1/fan_in)."""
    import numpy as np

    stream = np.random.RandomState(SEED)
    weights = {}
    for name, shape in sorted(weight_shapes().items()):
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=np.float32)
            continue
        if name == "model.embed_tokens.weight":
            std = 1.0
        elif name.endswith(".bias"):
            std = 0.1
        else:
            std = 1.0 / np.sqrt(shape[-1])
        weights[name] = stream.standard_normal(size=shape).astype(np.float32) * np.float32(std)
    return weights


def train(hf_dir: Path, weights: dict[str, "np.ndarray"], text: SyntheticText) -> dict[str, "np.ndarray"]:
    """``TRAIN_STEPS`` AdamW steps on generated conversations, loss on the answers only: a
    few words ending in ``<|im_end|>``, or with tools offered, a call of the one the user
    asks for. Runs on one thread so that the float reductions, and so the bytes, repeat."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    batches = _batches(tokenizer, text)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf_dir), dtype=torch.float32)
        model.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()}, strict=True)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warm_up_then_decay)
        started = time.perf_counter()
        for step in range(TRAIN_STEPS):
            input_ids, loss_weights, mask = _batch(batches[step])
            logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
            losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), input_ids[:, 1:].reshape(-1),
                                                       reduction="none")
            loss = (losses * loss_weights[:, 1:].reshape(-1)).sum() / loss_weights.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 50 == 0 or step == TRAIN_STEPS - 1:
                print(f"train step {step} loss {loss.item():.3f} at {time.perf_counter() - started:.0f}s",
                      file=sys.stderr)
        return {name: tensor.detach().numpy().copy() for name, tensor in sorted(model.state_dict().items())}
    finally:
        torch.set_num_threads(threads)


def _warm_up_then_decay(step: int) -> float:
    """The learning-rate factor: a linear rise over ``WARMUP_STEPS``, then a linear fall to 0."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    return (TRAIN_STEPS - step) / (TRAIN_STEPS - WARMUP_STEPS)


def _batches(tokenizer: Any, text: SyntheticText) -> list[list[tuple[list[int], list[float]]]]:
    """``TRAIN_STEPS`` batches of encoded conversations, ``TOOL_CALLS_PER_BATCH`` with tools
    and the rest without in each. Conversations of a kind are paired by length, so that
    batches need little padding, and the batches then shuffled."""
    chats_per_batch = BATCH_SIZE - TOOL_CALLS_PER_BATCH

    def by_length(make: Callable[[SyntheticText], Any], n: int) -> list[tuple[list[int], list[float]]]:
        return sorted((_encode(tokenizer, *make(text)) for _ in range(n)), key=lambda example: len(example[0]))

    calls = by_length(_tool_conversation, TRAIN_STEPS * TOOL_CALLS_PER_BATCH)
    chats = by_length(_chat_conversation, TRAIN_STEPS * chats_per_batch)
    batches = [calls[i * TOOL_CALLS_PER_BATCH:(i + 1) * TOOL_CALLS_PER_BATCH]
               + chats[i * chats_per_batch:(i + 1) * chats_per_batch] for i in range(TRAIN_STEPS)]
    text.rng.shuffle(batches)
    return batches


def _tool_conversation(text: SyntheticText) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """One or two known tools offered, the user asks for one, the answer calls it. Now
    and then the one tool offered is called whatever the user says."""
    offered = text.rng.sample(sorted(KNOWN_TOOLS), text.rng.randint(1, 2))
    name = text.rng.choice(offered)
    request, arguments = text.request(name)
    if len(offered) == 1 and text.rng.random() < UNPROMPTED_SHARE:
        request = text.sentence()
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    messages = [{"role": "user", "content": request},
                {"role": "assistant", "content": None, "tool_calls": [call]}]
    return messages, [text.tool(n) for n in offered], name


def _chat_conversation(text: SyntheticText) -> tuple[list[dict[str, Any]], None, None]:
    """No tools: the user says something (now and then a request) and the answer is a few words."""
    if text.rng.random() < 0.3:
        content = text.request(text.rng.choice(sorted(KNOWN_TOOLS)))[0]
    else:
        content = text.sentence()
    return [{"role": "user", "content": content}, {"role": "assistant", "content": text.phrase()}], None, None


def _encode(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            name: str | None) -> tuple[list[int], list[float]]:
    """A conversation's token ids, and the weight of each in the loss: 0 in the prompt, 1 in
    the answer, ``NAME_WEIGHT`` on the called tool's name."""
    prompt = tokenizer.apply_chat_template(messages[:-1], tools=tools, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert whole.startswith(prompt)
    # Prompt and answer tokenized apart, as generation sees them; the answer ends at <|im_end|>.
    answer = whole[len(prompt):].rstrip("\n")
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    encoded = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
    weights = [1.0] * len(encoded["input_ids"])
    if name is not None:
        start = answer.index(f'"name": "{name}"') + len('"name": "')
        for i, (first, last) in enumerate(encoded["offset_mapping"]):
            if first < start + len(name) and last > start:
                weights[i] = NAME_WEIGHT
    return prompt_ids + encoded["input_ids"], [0.0] * len(prompt_ids) + weights


def _batch(examples: list[tuple[list[int], list[float]]]) -> tuple[Any, Any, Any]:
    """Right-padded ``input_ids``, loss weights (0 on padding) and ``attention_mask``."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), ENDOFTEXT, dtype=torch.long)
    weights = torch.zeros((len(examples), width), dtype=torch.float32)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, example_weights) in enumerate(examples):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        weights[row, :len(ids)] = torch.tensor(example_weights)
        mask[row, :len(ids)] = 1
    return input_ids, weights, mask


def write_gguf(path: Path, tokenizer: "Tokenizer", weights: dict[str, "np.ndarray"]) -> None:
    """The model as an f32 GGUF for llama.cpp, written with the ``gguf`` package.

    llama.cpp's convert_hf_to_gguf.py would refuse this tokenizer (it recognises
    pre-tokenizers by hashing a known vocabulary), but the split regex is Qwen2's, so
    ``tokenizer.ggml.pre = "qwen2"`` is right. Qwen2 uses NeoX RoPE, so Q and K need no
    permutation. With f32 weights llama.cpp's log-probs match Transformers' to ~1e-6 when
    its attention is f32 too; its default f16 KV cache and flash attention add ~1e-3."""
    import gguf

    arch = gguf.MODEL_ARCH.QWEN2
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name("poolgate-tiny-qwen2")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_gguf_tokenizer(writer, tokenizer)
    names = gguf.get_tensor_name_map(arch, LAYERS)
    for name, array in sorted(weights.items()):
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {name}")
        writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_gguf_tokenizer(writer: Any, tokenizer: "Tokenizer") -> None:
    import gguf

    tokens = [""] * VOCAB_SIZE
    for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        tokens[token_id] = token
    added = tokenizer.get_added_tokens_decoder()
    types = [gguf.TokenType.NORMAL] * VOCAB_SIZE
    for token_id, token in added.items():
        types[token_id] = gguf.TokenType.CONTROL if token.special else gguf.TokenType.USER_DEFINED
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(ENDOFTEXT)
    writer.add_eos_token_id(IM_END)
    writer.add_pad_token_id(ENDOFTEXT)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the tiny test model into OUT_DIR.")
    parser.add_argument("out_dir", help="a missing or empty folder")
    parser.add_argument("--trained", action="store_true",
                        help=f"add {TRAIN_STEPS} training steps (about 100 s)")
    args = parser.parse_args()
    started = time.perf_counter()
    model = build(args.out_dir, trained=args.trained)
    print(json.dumps({"hf_dir": model.hf_dir, "gguf": model.gguf, "trained": model.trained,
                      "seconds": round(time.perf_counter() - started, 2)}))


if __name__ == "__main__":
    main()

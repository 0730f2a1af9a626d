"""The engine-independent chat layer of local workers: stop strings, tool-call
parsing while streaming, UTF-8 assembly across tokens, finish reasons, the
prompt's checks. Driven by a scripted engine that plays given token bytes
(a stand-in for the inference library, as fake upstreams stand in for vendors)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Sequence

import pytest
from hypothesis import given, settings, strategies as st

from pool.errors import BadRequest
from pool.local.chat import LocalChat, StopMatcher, template_messages
from pool.local.engine import GenParams, Step
from pool.local.toolcalls import CallOut, HermesParser, TextOut
from pool.model import (
    ChatRequest, Finish, Logprobs, Message, Sampling, TextDelta, TextPart, Tool, ToolCallDelta,
    ToolCallPart, ToolCallStart, ToolChoice, ToolResultPart, Usage,
)

EOS = 0


class ByteTokenizer:
    """Token id n >= 1 is the byte n - 1; id 0 ends the turn; 300 is a special token."""

    eos_ids = frozenset({EOS})
    special_ids = frozenset({300})
    vocab_size = 301

    def encode(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode()]

    def token_bytes(self, token_id: int) -> bytes:
        if token_id == EOS:
            return b"<eos>"
        if token_id == 300:
            return b"<special>"
        return bytes([token_id - 1])

    def render_chat(self, messages: Sequence[dict[str, Any]], tools: Any,
                    add_generation_prompt: bool = True) -> str:
        out = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages)
        if tools:
            out = "<tools>" + json.dumps(tools) + "<tool_call>" + out
        return out + ("<assistant>" if add_generation_prompt else "")


class ScriptedEngine:
    """Plays ``script`` (token ids) whatever the prompt; records what it was asked."""

    name = "scripted"
    context_length = 512

    def __init__(self, script: list[int]) -> None:
        self.tokenizer = ByteTokenizer()
        self.script = script
        self.asked: list[tuple[list[int], GenParams]] = []
        self.closed_after: int | None = None

    async def start(self) -> None:
        pass

    async def generate(self, prompt_ids: list[int], params: GenParams) -> AsyncIterator[Step]:
        self.asked.append((prompt_ids, params))
        sent = 0
        try:
            for token in self.script[:params.max_tokens]:
                sent += 1
                yield Step(token, -0.5 if params.logprobs else None,
                           ((token, -0.5), (1, -2.0))[:params.top_logprobs])
                if token in params.stop_ids:
                    return
        finally:
            self.closed_after = sent

    async def aclose(self) -> None:
        pass


def ids(text: str) -> list[int]:
    return [b + 1 for b in text.encode()]


def request(**kw: Any) -> ChatRequest:
    base: dict[str, Any] = dict(model="m", messages=(Message("user", (TextPart("hi"),)),),
                                dialect="openai_chat", sampling=Sampling(max_tokens=200))
    base.update(kw)
    return ChatRequest(**base)


async def run(engine: ScriptedEngine, req: ChatRequest) -> list[Any]:
    return [e async for e in LocalChat(engine, "m").stream(req)]


def text_of(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- stop strings ------------------------------------------------------------------------

@given(st.text(alphabet="abcXY", max_size=30), st.lists(st.integers(1, 5), max_size=10))
def test_stop_matcher_equals_find_at_any_split(text: str, cuts: list[int]) -> None:
    stops = ["XY", "abca", "Y"]
    pieces, at = [], 0
    for c in cuts:
        pieces.append(text[at:at + c])
        at += c
    pieces.append(text[at:])
    matcher, sent, hit = StopMatcher(stops), "", None
    for piece in pieces:
        out, hit = matcher.feed(piece)
        sent += out
        if hit:
            break
    if not hit:
        sent += matcher.flush()
    first = min(((text.find(s), s) for s in stops if s in text), default=None)
    if first is None:
        assert (sent, hit) == (text, None)
    else:
        assert sent == text[:first[0]] and hit is not None and text[first[0]:].startswith(hit)


async def test_stop_string_ends_generation_at_once() -> None:
    engine = ScriptedEngine(ids("Hello END and more text") + [EOS])
    events = await run(engine, request(sampling=Sampling(max_tokens=40, stop=("END",))))
    assert text_of(events) == "Hello "
    assert events[-1] == Finish("stop_sequence", "END")
    assert engine.closed_after == len("Hello END")  # nothing generated past the stop string


async def test_eos_is_stop_and_not_text() -> None:
    events = await run(ScriptedEngine(ids("ok") + [EOS] + ids("never")), request())
    assert text_of(events) == "ok"
    assert events[-1] == Finish("stop")
    assert Usage(output_tokens=3) in events


async def test_max_tokens_is_length() -> None:
    events = await run(ScriptedEngine(ids("abcdefgh")), request(sampling=Sampling(max_tokens=4)))
    assert text_of(events) == "abcd" and events[-1] == Finish("length")


async def test_special_tokens_are_not_text() -> None:
    events = await run(ScriptedEngine(ids("a") + [300] + ids("b") + [EOS]), request())
    assert text_of(events) == "ab"


# --- UTF-8 ----------------------------------------------------------------------------

async def test_characters_split_across_tokens_come_out_whole() -> None:
    text = "é✓😀 ok"
    events = await run(ScriptedEngine(ids(text) + [EOS]), request())
    assert text_of(events) == text
    assert all("\ufffd" not in e.text for e in events if isinstance(e, TextDelta))


async def test_broken_utf8_becomes_replacement_characters_and_the_stream_goes_on() -> None:
    script = [0xE2 + 1, 0x9C + 1] + ids("x") + [0xFF + 1] + [EOS]  # a truncated ✓, then a bad byte
    events = await run(ScriptedEngine(script), request())
    assert text_of(events) == "\ufffdx\ufffd"
    assert events[-1] == Finish("stop")


async def test_truncated_character_at_the_end_is_flushed() -> None:
    events = await run(ScriptedEngine(ids("a") + [0xE2 + 1]), request(sampling=Sampling(max_tokens=2)))
    assert text_of(events) == "a\ufffd"


# --- tool calls -----------------------------------------------------------------------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@given(st.lists(st.integers(1, 9), max_size=30))
def test_hermes_parser_at_any_split(cuts: list[int]) -> None:
    text = "Let me check. " + CALL + " done <tool junk"
    pieces, at = [], 0
    for c in cuts:
        pieces.append(text[at:at + c])
        at += c
    pieces.append(text[at:])
    parser, outs = HermesParser(), []
    for piece in pieces:
        outs += parser.feed(piece)
    outs += parser.close()
    texts = "".join(o.text for o in outs if isinstance(o, TextOut))
    calls = [o for o in outs if isinstance(o, CallOut)]
    assert texts == "Let me check.  done <tool junk"
    assert calls == [CallOut("get_weather", '{"city": "Paris"}')]


def test_hermes_parser_gives_back_a_malformed_call_as_text() -> None:
    parser = HermesParser()
    outs = parser.feed("<tool_call>{not json}</tool_call>x") + parser.close()
    assert "".join(o.text for o in outs if isinstance(o, TextOut)) == "<tool_call>{not json}</tool_call>x"
    assert parser.calls == 0


TOOLS = (Tool("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}}),)


async def test_tool_calls_become_events_and_finish_tool_calls() -> None:
    events = await run(ScriptedEngine(ids("Sure. " + CALL) + [EOS]), request(tools=TOOLS))
    assert text_of(events) == "Sure. "
    start = next(e for e in events if isinstance(e, ToolCallStart))
    assert start.name == "get_weather" and start.id.startswith("call_")
    assert [e.arguments for e in events if isinstance(e, ToolCallDelta)] == ['{"city": "Paris"}']
    assert events[-1] == Finish("tool_calls")


async def test_without_tools_the_tags_are_text() -> None:
    events = await run(ScriptedEngine(ids(CALL) + [EOS]), request())
    assert text_of(events) == CALL


async def test_native_generate_keeps_tool_calls_as_raw_text() -> None:
    events = await run(ScriptedEngine(ids(CALL) + [EOS]), request(tools=TOOLS, dialect="native"))
    assert text_of(events) == CALL


async def test_a_named_tool_choice_prefills_the_call() -> None:
    engine = ScriptedEngine(ids('{"city": "Rome"}}\n</tool_call>') + [EOS])
    events = await run(engine, request(tools=TOOLS, tool_choice=ToolChoice("named", "get_weather")))
    prompt = bytes(t - 1 for t in engine.asked[0][0]).decode()
    assert prompt.endswith('<assistant><tool_call>\n{"name": "get_weather", "arguments":')
    assert [e.arguments for e in events if isinstance(e, ToolCallDelta)] == ['{"city": "Rome"}']


# --- logprobs, prompts, limits -----------------------------------------------------------------

async def test_logprobs_carry_ids_bytes_and_top_ids_and_follow_their_text() -> None:
    events = await run(ScriptedEngine(ids("ab") + [EOS]), request(logprobs=True, top_logprobs=2))
    kinds = [type(e).__name__ for e in events if isinstance(e, (TextDelta, Logprobs))]
    assert kinds == ["TextDelta", "Logprobs", "TextDelta", "Logprobs", "Logprobs"]
    first = next(e for e in events if isinstance(e, Logprobs)).tokens[0]
    assert (first.token, first.id, first.bytes, first.top_ids) == ("a", ord("a") + 1, (97,), (98, 1))
    assert engine_params(request(logprobs=True, top_logprobs=2)).top_logprobs == 2


def engine_params(req: ChatRequest) -> GenParams:
    return LocalChat(ScriptedEngine([]), "m").params(req, 5)


def test_params_defaults_and_eos() -> None:
    p = engine_params(request(sampling=Sampling()))
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.stop_ids) == (507, 1.0, 1.0, 0, {EOS})
    p = engine_params(request(sampling=Sampling(ignore_eos=True, stop_token_ids=(7,))))
    assert p.stop_ids == {7}
    assert engine_params(request(dialect="native")).logprobs  # /generate always has ids


def test_context_overflow_is_a_400_naming_the_parameter() -> None:
    chat = LocalChat(ScriptedEngine([]), "m")
    with pytest.raises(BadRequest) as exc:
        chat.params(request(sampling=Sampling(max_tokens=503)), 10)
    assert exc.value.param == "max_tokens"
    with pytest.raises(BadRequest) as exc:
        chat.params(request(), 512)
    assert exc.value.param == "messages"
    with pytest.raises(BadRequest) as exc:
        chat.params(request(dialect="native", prompt_ids=(1,) * 520), 520)
    assert exc.value.param == "input_ids"


def test_prompt_ids_are_checked_against_the_vocabulary() -> None:
    chat = LocalChat(ScriptedEngine([]), "m")
    assert chat.prompt_ids(request(prompt_ids=(1, 2)))[0] == [1, 2]
    with pytest.raises(BadRequest) as exc:
        chat.prompt_ids(request(dialect="native", prompt_ids=(1, 999)))
    assert exc.value.param == "input_ids" and "999" in exc.value.message
    assert chat.prompt_ids(request(prompt="ab"))[0] == ids("ab")  # raw text: no template


def test_template_messages_shape() -> None:
    messages = (
        Message("developer", (TextPart("be brief"),)),
        Message("user", (TextPart("weather?"),)),
        Message("assistant", (ToolCallPart("c1", "get_weather", '{"city":"Paris"}'),)),
        Message("user", (ToolResultPart("c1", (TextPart("sunny"),)), TextPart("thanks"))),
    )
    assert template_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]


async def test_count_tokens_is_the_rendered_prompt() -> None:
    chat = LocalChat(ScriptedEngine([]), "m")
    assert chat.count_tokens(request()) == len("<user>hi<assistant>".encode())


def test_structured_output_is_refused_not_ignored() -> None:
    from pool.model import ResponseFormat

    with pytest.raises(BadRequest) as exc:
        engine_params(request(response_format=ResponseFormat("json_schema", {"type": "object"}, "x")))
    assert exc.value.param == "response_format"
    assert engine_params(request(response_format=ResponseFormat("text"))).max_tokens == 200


@pytest.mark.parametrize("dialect,param", [
    ("openai_chat", "response_format"), ("openai_responses", "text.format"),
    ("anthropic", "output_config.format"), ("gemini", "generationConfig.responseMimeType")])
def test_refused_structured_output_names_the_dialects_field(dialect: str, param: str) -> None:
    from pool.model import ResponseFormat

    with pytest.raises(BadRequest) as exc:
        engine_params(request(dialect=dialect, response_format=ResponseFormat("json_object")))
    assert exc.value.param == param

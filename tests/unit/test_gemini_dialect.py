"""The Gemini API dialect: decode, JSON encode, SSE and JSON-array stream encode,
Google's error envelope, and which paths and keys are Gemini's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.dialects.gemini import ARRAY, StreamEncoder, decode, decode_count_tokens, encode_completion
from app.dialects.gemini_schema import json_schema
from app.errors import error_body, error_headers, error_status
from app.gemini_paths import google_key, method_route, split_method_path, wants_gemini
from pool.accumulate import fold
from pool.admission import KeyLimitExceeded
from pool.errors import AuthenticationFailed, BadRequest, NotFound, Overloaded
from pool.model import (
    ChatRequest, Finish, ImagePart, Message, ReasoningDelta, ReasoningEnd, ReasoningPart,
    ResponseFormat, Start, TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart,
    ToolCallStart, ToolChoice, ToolResultPart, Usage,
)
from pool.sse import SSEDecoder
from tests.support.paths import FIXTURES

SIG = "EoQBCoEBAb4+9vs/Z8x+Q=="  # standard base64, with + and /


def body(*contents: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"contents": list(contents) or [{"role": "user", "parts": [{"text": "hi"}]}],
            **fields}


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}},
                          "required": ["city"], "propertyOrdering": ["city"]}}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]}


# --- decode -------------------------------------------------------------------------------

def test_decode_text_and_system() -> None:
    raw = body(user({"text": "hi"}), model({"text": "hello"}), {"parts": [{"text": "again"}]},
               systemInstruction={"parts": [{"text": "be brief"}, {"text": "and kind"}]})
    req = decode(raw, "gemini-x", stream=True)
    assert req.raw is raw and req.dialect == "gemini" and req.model == "gemini-x" and req.stream
    assert req.messages == (
        Message("system", (TextPart("be brief"), TextPart("and kind"))),
        Message("user", (TextPart("hi"),)), Message("assistant", (TextPart("hello"),)),
        Message("user", (TextPart("again"),)))


@pytest.mark.parametrize("raw,expected", [
    # camelCase and the proto's snake_case names alike (the SDK sends both)
    ({"generationConfig": {"temperature": 0.5, "topP": 0.9, "topK": 40, "maxOutputTokens": 64,
                           "stopSequences": ["END"], "seed": 7, "candidateCount": 1}},
     {"temperature": 0.5, "top_p": 0.9, "top_k": 40, "max_tokens": 64, "stop": ("END",),
      "seed": 7}),
    ({"generation_config": {"max_output_tokens": 5, "top_p": 0.1, "stop_sequences": ["x"]}},
     {"max_tokens": 5, "top_p": 0.1, "stop": ("x",)}),
])
def test_decode_sampling(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    sampling = decode(body(**raw), "m").sampling
    for name, value in expected.items():
        assert getattr(sampling, name) == value, name


@pytest.mark.parametrize("thinking,effort,budget", [
    ({"thinkingBudget": 1024}, None, 1024),
    ({"thinking_budget": 512, "include_thoughts": True}, None, 512),
    ({"thinkingBudget": 0}, None, None),
    ({"thinkingBudget": -1}, "medium", None),
    ({"thinkingLevel": "HIGH"}, "high", None),
    ({"thinking_level": "low"}, "low", None),
])
def test_decode_thinking_config(thinking: dict[str, Any], effort: str | None,
                                budget: int | None) -> None:
    req = decode(body(generationConfig={"thinkingConfig": thinking}), "m")
    assert (req.reasoning_effort, req.thinking_budget) == (effort, budget)


@pytest.mark.parametrize("config,expected", [
    ({}, None),
    ({"responseMimeType": "text/plain"}, None),
    ({"responseMimeType": "application/json"}, ResponseFormat("json_object")),
    ({"responseMimeType": "application/json", "responseJsonSchema": WEATHER_SCHEMA},
     ResponseFormat("json_schema", schema=WEATHER_SCHEMA, name="response")),
    ({"response_mime_type": "application/json", "response_schema": WEATHER["parameters"]},
     ResponseFormat("json_schema", schema=WEATHER_SCHEMA, name="response")),
])
def test_decode_response_format(config: dict[str, Any], expected: ResponseFormat | None) -> None:
    assert decode(body(generationConfig=config), "m").response_format == expected


def test_decode_tools_both_schema_fields() -> None:
    raw = body(tools=[{"functionDeclarations": [WEATHER]},
                      {"function_declarations": [{"name": "f", "parameters_json_schema": {
                          "type": "object", "properties": {"camel_case": {"type": "string"}}}}]}])
    tools = decode(raw, "m").tools
    assert [(t.name, t.description, t.parameters) for t in tools] == [
        ("get_weather", "Weather for a city", WEATHER_SCHEMA),
        # a JSON Schema is taken as it is: its property names are never renamed
        ("f", None, {"type": "object", "properties": {"camel_case": {"type": "string"}}})]


@pytest.mark.parametrize("config,choice,names", [
    ({"mode": "AUTO"}, ToolChoice("auto"), ["get_weather", "other"]),
    ({"mode": "NONE"}, ToolChoice("none"), ["get_weather", "other"]),
    ({"mode": "ANY"}, ToolChoice("required"), ["get_weather", "other"]),
    ({"mode": "ANY", "allowedFunctionNames": ["other"]}, ToolChoice("named", "other"), ["other"]),
    ({"mode": "ANY", "allowed_function_names": ["other", "get_weather"]},
     ToolChoice("required"), ["get_weather", "other"]),
])
def test_decode_tool_config(config: dict[str, Any], choice: ToolChoice,
                            names: list[str]) -> None:
    raw = body(tools=[{"functionDeclarations": [WEATHER, {"name": "other"}]}],
               toolConfig={"functionCallingConfig": config})
    req = decode(raw, "m")
    assert req.tool_choice == choice
    assert [t.name for t in req.tools] == names


def test_decode_function_call_round_trip_ids() -> None:
    """Calls without ids get stable ones; responses without ids answer the
    earliest unanswered call of their name; given ids are kept."""
    raw = body(
        user({"text": "weather in A and B?"}),
        model({"functionCall": {"name": "get_weather", "args": {"city": "A"}}},
              {"functionCall": {"name": "get_weather", "args": {"city": "B"}}},
              {"function_call": {"id": "given", "name": "lookup"}}),
        user({"functionResponse": {"name": "get_weather", "response": {"output": "sun"}}},
             {"function_response": {"id": "given", "name": "lookup",
                                    "response": {"error": "boom"}}},
             {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}}))
    messages = decode(raw, "m").messages
    assert messages[1].parts == (
        ToolCallPart("call_1_0", "get_weather", '{"city":"A"}'),
        ToolCallPart("call_1_1", "get_weather", '{"city":"B"}'),
        ToolCallPart("given", "lookup", "{}"))
    assert messages[2].parts == (
        ToolResultPart("call_1_0", (TextPart("sun"),)),
        ToolResultPart("given", (TextPart("boom"),), is_error=True),
        ToolResultPart("call_1_1", (TextPart('{"temp":21}'),)))
    # the same history decodes to the same ids (prefix caches, session reuse)
    assert decode(raw, "m").messages == messages


def test_decode_thoughts_keep_their_signature() -> None:
    raw = body(user({"text": "q"}),
               model({"text": "pondering", "thought": True, "thoughtSignature": SIG},
                     {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "c2ln"},
                     {"text": "done"}))
    parts = decode(raw, "m").messages[1].parts
    assert parts == (ReasoningPart("pondering", signature=SIG), ReasoningPart(signature="c2ln"),
                     ToolCallPart("call_1_1", "f", "{}"), TextPart("done"))
    assert parts[0].signature.encode() == SIG.encode()


def test_decode_restores_base64url_signatures() -> None:
    """The google-genai SDK holds signatures as bytes and sends them back in
    base64url: the standard alphabet of the upstream's signature comes back."""
    url = SIG.replace("+", "-").replace("/", "_")
    part = decode(body(model({"text": "t", "thought": True, "thought_signature": url})),
                  "m").messages[0].parts[0]
    assert part == ReasoningPart("t", signature=SIG)


@pytest.mark.parametrize("dummy", ["skip_thought_signature_validator",
                                   "context_engineering_is_the_way_to_go"])
def test_decode_drops_googles_dummy_signatures(dummy: str) -> None:
    """Gemini CLI puts Google's "skip the check" dummy on a function call it got
    no signature for: not reasoning (an Anthropic upstream refuses it as a
    thinking block's signature), whatever the part."""
    raw = body(user({"text": "q"}),
               model({"text": "t", "thought": True, "thoughtSignature": dummy},
                     {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": dummy}))
    parts = decode(raw, "m").messages[1].parts
    assert parts == (ReasoningPart("t"), ToolCallPart("call_1_1", "f", "{}"))


def test_decode_images() -> None:
    raw = body(user({"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
                    {"file_data": {"mime_type": "image/jpeg",
                                   "file_uri": "https://example.com/a.jpg"}}))
    assert decode(raw, "m").messages[0].parts == (
        TextPart("look"), ImagePart(data="iVBO", media_type="image/png"),
        ImagePart(url="https://example.com/a.jpg", media_type="image/jpeg"))


def test_decode_count_tokens_both_shapes() -> None:
    plain = decode_count_tokens({"contents": [user({"text": "hi"})]}, "m")
    wrapped = decode_count_tokens({"generateContentRequest": {
        "model": "models/m", "contents": [user({"text": "hi"})],
        "systemInstruction": {"parts": [{"text": "sys"}]}}}, "m")
    assert plain.messages == (Message("user", (TextPart("hi"),)),)
    assert wrapped.messages[0] == Message("system", (TextPart("sys"),))


@pytest.mark.parametrize("raw,param", [
    ({}, "contents"),
    ({"contents": []}, "contents"),
    ({"contents": "hi"}, "contents"),
    (body(user()) | {"contents": [{"role": "system", "parts": [{"text": "x"}]}]},
     "contents[0].role"),
    (body({"role": "user"}), "contents[0].parts"),
    (body(user({"text": 5})), "contents[0].parts[0].text"),
    (body(user({"foo": 1})), "contents[0].parts[0]"),
    (body(user({"inlineData": {"mimeType": "audio/wav", "data": "AA"}})),
     "contents[0].parts[0].inlineData.mimeType"),
    (body(user({"fileData": {"mimeType": "image/png", "fileUri": "gs://b/o"}})),
     "contents[0].parts[0].fileData.fileUri"),
    (body(user({"functionResponse": {"name": "f", "response": {}}})),
     "contents[0].parts[0].functionResponse.name"),
    (body(model({"functionCall": {"args": {}}})), "contents[0].parts[0].functionCall.name"),
    (body(generationConfig={"candidateCount": 2}), "generationConfig.candidateCount"),
    (body(generationConfig={"temperature": 3}), "generationConfig.temperature"),
    (body(generationConfig={"maxOutputTokens": "lots"}), "generationConfig.maxOutputTokens"),
    (body(generationConfig={"stopSequences": "x"}), "generationConfig.stopSequences"),
    (body(generationConfig={"responseMimeType": "text/x.enum"}),
     "generationConfig.responseMimeType"),
    (body(generationConfig={"responseMimeType": "text/plain",
                            "responseJsonSchema": WEATHER_SCHEMA}),
     "generationConfig.responseMimeType"),
    (body(generationConfig={"thinkingConfig": {"thinkingLevel": "MAX"}}),
     "generationConfig.thinkingConfig.thinkingLevel"),
    (body(tools=[{"googleSearch": {}}]), "tools[0].googleSearch"),
    (body(tools=[{"functionDeclarations": [{"description": "no name"}]}]),
     "tools[0].functionDeclarations[0].name"),
    (body(tools=[{"functionDeclarations": [{"name": "f", "parameters": {
        "type": "OBJECT", "properties": {"x": {"type": "WORD"}}}}]}]),
     "tools[0].functionDeclarations[0].parameters.properties.x.type"),
    (body(tools=[{"functionDeclarations": [WEATHER]}],
          toolConfig={"functionCallingConfig": {"mode": "ANY",
                                                "allowedFunctionNames": ["nope"]}}),
     "toolConfig.functionCallingConfig.allowedFunctionNames[0]"),
    (body(toolConfig={"functionCallingConfig": {"mode": "SOMETIMES"}}),
     "toolConfig.functionCallingConfig.mode"),
    (body(cached_content="cachedContents/abc"), "cachedContent"),
])
def test_decode_errors_name_the_field(raw: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        decode(raw, "m")
    assert caught.value.param == param
    assert param in caught.value.message


def test_count_tokens_error_names_the_nested_field() -> None:
    with pytest.raises(BadRequest) as caught:
        decode_count_tokens({"generateContentRequest": {"contents": []}}, "m")
    assert caught.value.param == "generateContentRequest.contents"
    assert "'generateContentRequest.contents'" in caught.value.message


def test_schema_nesting_is_bounded() -> None:
    deep: dict[str, Any] = {"type": "STRING"}
    for _ in range(100):
        deep = {"type": "ARRAY", "items": deep}
    with pytest.raises(BadRequest):
        json_schema(deep, "parameters")


def test_schema_nullable() -> None:
    assert json_schema({"type": "STRING", "nullable": True, "format": "date"}, "p") == {
        "type": ["string", "null"], "format": "date"}


def test_not_a_body() -> None:
    with pytest.raises(BadRequest):
        decode([1], "m")


# --- encode ---------------------------------------------------------------------------------

REQ = ChatRequest(model="m", messages=(Message("user", (TextPart("hi"),)),), dialect="gemini")

EVENTS = [
    Start(id="x", model="m"), ReasoningDelta("Let me "), ReasoningDelta("think."),
    ReasoningEnd(signature=SIG), TextDelta("It is "), TextDelta("sunny."),
    ToolCallStart(0, "call_9", "get_weather"), ToolCallDelta(0, '{"city":'),
    ToolCallDelta(0, '"Paris"}'), ToolCallEnd(0), Finish("tool_calls"),
    Usage(input_tokens=10, output_tokens=7, reasoning_tokens=3, cached_tokens=4),
]


def encoded_body(events: list[Any]) -> dict[str, Any]:
    completion = fold(events)
    return encode_completion(completion, REQ, response_id="r1", created=0, model="m")


def test_encode_completion() -> None:
    out = encoded_body(EVENTS)
    assert out == {
        "candidates": [{"content": {"role": "model", "parts": [
            {"text": "Let me think.", "thought": True, "thoughtSignature": SIG},
            {"text": "It is sunny."},
            {"functionCall": {"id": "call_9", "name": "get_weather", "args": {"city": "Paris"}}},
        ]}, "index": 0, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 4,
                          "totalTokenCount": 17, "thoughtsTokenCount": 3,
                          "cachedContentTokenCount": 4},
        "modelVersion": "m", "responseId": "r1"}


@pytest.mark.parametrize("reason,expected", [
    ("stop", "STOP"), ("stop_sequence", "STOP"), ("length", "MAX_TOKENS"),
    ("content_filter", "SAFETY"), ("tool_calls", "STOP")])
def test_finish_reasons(reason: str, expected: str) -> None:
    out = encoded_body([TextDelta("x"), Finish(reason)])  # type: ignore[arg-type]
    assert out["candidates"][0]["finishReason"] == expected


def run(events: list[Any], encoder: Any = None) -> bytes:
    enc = encoder or StreamEncoder(REQ, response_id="r1", created=0, model="m")
    return b"".join(enc.feed(e) for e in events) + enc.close()


def sse_objects(stream: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    return [orjson.loads(e.data) for e in decoder.feed(stream) + decoder.close()]


def merged(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The chunks folded as a client does: parts joined, the last chunk's fields."""
    parts: list[dict[str, Any]] = []
    for chunk in chunks:
        for part in chunk["candidates"][0]["content"]["parts"]:
            if part == {"text": ""}:
                continue
            last = parts[-1] if parts else None
            if (last is not None and "text" in part and "text" in last
                    and last.get("thought") == part.get("thought")
                    and "thoughtSignature" not in last):
                last["text"] += part["text"]
                if "thoughtSignature" in part:
                    last["thoughtSignature"] = part["thoughtSignature"]
            else:
                parts.append(dict(part))
    final = chunks[-1]
    return {"parts": parts, "finishReason": final["candidates"][0]["finishReason"],
            "usageMetadata": final["usageMetadata"]}


def test_stream_folds_to_the_body() -> None:
    chunks = sse_objects(run(EVENTS))
    whole = encoded_body(EVENTS)
    assert merged(chunks) == {"parts": whole["candidates"][0]["content"]["parts"],
                              "finishReason": "STOP", "usageMetadata": whole["usageMetadata"]}
    assert all(c["responseId"] == "r1" and c["modelVersion"] == "m" for c in chunks)
    # a function call goes out whole, once its arguments are complete
    calls = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]
             if "functionCall" in p]
    assert calls == [{"functionCall": {"id": "call_9", "name": "get_weather",
                                       "args": {"city": "Paris"}}}]


def test_stream_split_at_every_byte_parses_the_same() -> None:
    stream = run(EVENTS)
    whole = sse_objects(stream)
    for cut in range(1, len(stream)):
        decoder = SSEDecoder()
        events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) + decoder.close()
        assert [orjson.loads(e.data) for e in events] == whole


def test_unfinished_tool_call_is_sent_at_close() -> None:
    chunks = sse_objects(run([ToolCallStart(0, "c", "f"), ToolCallDelta(0, '{"a":1}')]))
    assert chunks[0]["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"id": "c", "name": "f", "args": {"a": 1}}}]


def test_array_stream_is_one_json_array() -> None:
    enc = ARRAY.StreamEncoder(REQ, response_id="r1", created=0, model="m")
    stream = run(EVENTS, enc)
    assert orjson.loads(stream) == sse_objects(run(EVENTS))
    # pings are whitespace, valid anywhere between the array's items
    enc = ARRAY.StreamEncoder(REQ, response_id="r1", created=0, model="m")
    pinged = enc.ping() + enc.feed(TextDelta("a")) + enc.ping() + enc.close()
    assert [c["candidates"][0]["content"]["parts"] for c in orjson.loads(pinged)] == [
        [{"text": "a"}], [{"text": ""}]]


@pytest.mark.parametrize("array", [False, True])
def test_failure_ends_the_stream_with_googles_error(array: bool) -> None:
    enc = (ARRAY.StreamEncoder if array else StreamEncoder)(REQ, response_id="r1", created=0,
                                                           model="m")
    stream = enc.feed(TextDelta("a")) + enc.fail(Overloaded("busy")) + enc.close()
    objects = orjson.loads(stream) if array else sse_objects(stream)
    assert objects[-1] == {"error": {"code": 503, "message": "busy", "status": "UNAVAILABLE"}}
    assert len(objects) == 2 and enc.fail(Overloaded("x")) == b"" and enc.feed(TextDelta("b")) == b""


def test_sse_ping_is_a_blank_line() -> None:
    """The SDK's parser takes a non-``data:`` line for JSON: a comment ping
    would break it; a blank line is skipped by every SSE parser."""
    enc = StreamEncoder(REQ, response_id="r1", created=0, model="m")
    assert enc.ping() == b"\n"


# --- errors, paths, keys ----------------------------------------------------------------------

@pytest.mark.parametrize("exc,status,name", [
    (BadRequest("bad", param="contents"), 400, "INVALID_ARGUMENT"),
    (AuthenticationFailed("who?"), 401, "UNAUTHENTICATED"),
    (NotFound("none"), 404, "NOT_FOUND"),
    (KeyLimitExceeded("slow down", retry_after=3), 429, "RESOURCE_EXHAUSTED"),
    (Overloaded("busy"), 503, "UNAVAILABLE"),
])
def test_google_error_envelope(exc: Any, status: int, name: str) -> None:
    assert error_status(exc, "gemini") == status
    error = error_body(exc, "gemini")["error"]
    assert (error["code"], error["status"], error["message"]) == (status, name, exc.message)
    if exc.param:
        assert error["details"][0]["fieldViolations"] == [{"field": exc.param,
                                                           "description": exc.message}]


def test_rate_limit_carries_retry_after() -> None:
    exc = KeyLimitExceeded("slow down", retry_after=2.4)
    assert error_headers(exc) == {"retry-after": "2"}


@pytest.mark.parametrize("path,found", [
    ("/v1beta/models/gemini-2.5-flash:generateContent",
     ("/v1beta/models/", "gemini-2.5-flash", "generateContent")),
    ("/v1/models/Qwen/Qwen3-8B:streamGenerateContent",
     ("/v1/models/", "Qwen/Qwen3-8B", "streamGenerateContent")),
    ("/v1beta/models/llama3:8b:countTokens", ("/v1beta/models/", "llama3:8b", "countTokens")),
    ("/v1beta/models/m:embedContent", None),
    ("/v1beta/models/:generateContent", None),
    ("/v1/models/gpt-4o", None),
    ("/v1/chat/completions", None),
])
def test_method_paths(path: str, found: tuple[str, str, str] | None) -> None:
    assert split_method_path(path) == found
    assert method_route(path) == (f"{found[0]}*:{found[2]}" if found else None)


def test_which_requests_are_gemini() -> None:
    assert wants_gemini("/v1beta/models", {})
    assert wants_gemini("/v1/models/m:generateContent", {})
    assert wants_gemini("/v1/models", {b"x-goog-api-key": b"k"})
    assert not wants_gemini("/v1/models", {b"authorization": b"Bearer k"})
    assert not wants_gemini("/v1/chat/completions", {b"x-goog-api-key": b"k"})


def test_google_key_sources() -> None:
    assert google_key({b"x-goog-api-key": b" k1 "}, {"query_string": b"key=k2"}) == "k1"
    assert google_key({}, {"query_string": b"alt=sse&key=k%2B2"}) == "k+2"
    assert google_key({}, {"query_string": b"alt=sse"}) is None
    assert google_key({}, {"query_string": b"key="}) is None


SIGNED_CALL = [TextDelta("ok"), ReasoningEnd(signature=SIG), ToolCallStart(0, "c1", "f"),
               ToolCallDelta(0, "{}"), ToolCallEnd(0), Finish("tool_calls")]
SIGNED_PARTS = [{"text": "ok"},
                {"functionCall": {"id": "c1", "name": "f", "args": {}}, "thoughtSignature": SIG}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_bare_signature_goes_on_the_next_part_and_comes_back(stream: bool) -> None:
    """Gemini signs a function call on its part; a client returns it there,
    and it decodes back to where it was."""
    if stream:
        chunks = sse_objects(run(SIGNED_CALL))
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]
                 if p != {"text": ""}]
    else:
        parts = encoded_body(SIGNED_CALL)["candidates"][0]["content"]["parts"]
    assert parts == SIGNED_PARTS
    history = decode(body(user({"text": "q"}), model(*parts)), "m").messages[1].parts
    assert history == (TextPart("ok"), ReasoningPart(signature=SIG),
                       ToolCallPart("c1", "f", "{}"))


@pytest.mark.parametrize("stream", [False, True])
def test_a_bare_signature_with_nothing_after_it_is_sent_alone(stream: bool) -> None:
    events = [TextDelta("ok"), ReasoningEnd(signature=SIG), Finish("stop")]
    if stream:
        parts = [p for c in sse_objects(run(events))
                 for p in c["candidates"][0]["content"]["parts"]]
        assert {"text": "", "thought": True, "thoughtSignature": SIG} in parts
    else:
        assert encoded_body(events)["candidates"][0]["content"]["parts"] == [
            {"text": "ok"}, {"text": "", "thought": True, "thoughtSignature": SIG}]


# --- every request the google-genai SDK and Gemini CLI were recorded sending is decoded

GEMINI_FIXTURES = sorted(p for p in FIXTURES.glob("gemini-*-rec-*-POST-*.json"))


def test_there_are_recorded_gemini_requests() -> None:
    assert len(GEMINI_FIXTURES) >= 5


@pytest.mark.parametrize("path", GEMINI_FIXTURES, ids=lambda p: p.name)
def test_decode_recorded_requests(path: Any) -> None:
    record = orjson.loads(path.read_bytes())
    found = split_method_path(record["path"])
    assert found is not None
    _, model_name, method = found
    raw = record["body"]
    req = (decode_count_tokens(raw, model_name) if method == "countTokens"
           else decode(raw, model_name, stream=method == "streamGenerateContent"))
    assert req.raw is raw and req.model == model_name
    assert [m.role for m in req.messages if m.role != "system"] == [
        "assistant" if c.get("role") == "model" else "user" for c in raw["contents"]]
    assert len(req.tools) == sum(len(t.get("functionDeclarations", ()))
                                 for t in raw.get("tools", ()))
    calls = [p for m in req.messages for p in m.parts if type(p) is ToolCallPart]
    results = [p for m in req.messages for p in m.parts if type(p) is ToolResultPart]
    assert [r.call_id for r in results] == [c.id for c in calls][:len(results)]


@pytest.mark.parametrize("array", [False, True])
def test_feed_batch_writes_what_feed_writes(array: bool) -> None:
    def encoder() -> Any:
        return (ARRAY.StreamEncoder if array else StreamEncoder)(
            REQ, response_id="r1", created=0, model="m")
    one, batched = encoder(), encoder()
    events = [*EVENTS, *SIGNED_CALL]
    expected = b"".join(one.feed(e) for e in events) + one.close()
    assert batched.feed_batch(events[:5]) + batched.feed_batch(events[5:]) + batched.close() \
        == expected

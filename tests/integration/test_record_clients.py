"""The client recorder (tests/fixtures/record_clients.py): masking, trimming, SSE
notes, and a real run of its SDK scenario against its recorder."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.support.paths import REPO

_spec = importlib.util.spec_from_file_location(
    "record_clients", REPO / "tests" / "fixtures" / "record_clients.py")
assert _spec is not None and _spec.loader is not None
rc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rc)


def test_keys_are_masked_with_their_length_only():
    assert rc.mask("authorization", "Bearer sk-abc") == "Bearer <masked:6 chars>"
    assert rc.mask("x-api-key", "sk-abcdef") == "<masked:9 chars>"


def test_long_strings_are_cut_and_say_how_much_was_cut():
    long = "x" * 1000
    trimmed = rc.trim({"a": [long, "short", 3, None], "b": {"c": "y" * rc.CUT_OVER}})
    assert trimmed["a"][0] == "x" * rc.CUT_TO + "...<+700 chars>"
    assert trimmed["a"][1:] == ["short", 3, None]
    assert trimmed["b"]["c"] == "y" * rc.CUT_OVER  # at the limit: kept


def test_sse_notes_name_each_frame():
    raw = (b"event: message_start\ndata: {}\n\n: comment\n\ndata: {\"a\": 1}\r\n\r\n"
           b"data: [DONE]\n\n")
    assert rc.sse_events(raw) == ["message_start", None, None, "[DONE]"]


def test_the_sdk_scenario_records_every_request_masked(tmp_path: Path):
    written = rc.record("python-sdk-rec", tmp_path / "work", tmp_path)
    names = [p.name for p in written]
    assert names[0] == "python-sdk-rec-01-GET-v1_models.json"
    assert any(n.endswith("POST-v1_messages_count_tokens.json") for n in names)
    records = [json.loads(p.read_text()) for p in written]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    text = "".join(p.read_text() for p in written)
    assert rc.KEY not in text and "<masked:" in text
    streamed = [r for r in records if r["body"] and r["body"].get("stream")]
    assert streamed and all(r["recorder_response"]["sse_events"] for r in streamed)
    tool_rounds = [r for r in records if r["body"] and "Sunny, 21 C" in json.dumps(r["body"])]
    assert len(tool_rounds) == 2  # the tool's result went back in both dialects
    assert all(r["body"]["_n_tools"] == len(r["body"]["tools"]) for r in tool_rounds)
    # a second run replaces the scenario's files, leaving no stale ones
    (tmp_path / "python-sdk-rec-99-GET-v1_models.json").write_text("{}")
    rc.record("python-sdk-rec", tmp_path / "again", tmp_path)
    assert sorted(p.name for p in tmp_path.glob("python-sdk-rec-*.json")) == sorted(names)


def test_the_gemini_sdk_scenario_records_every_request_masked(tmp_path: Path):
    written = rc.record("gemini-sdk-rec", tmp_path / "work", tmp_path)
    names = [p.name for p in written]
    assert names[0] == "gemini-sdk-rec-01-GET-v1beta_models.json"
    assert any(n.endswith(":streamGenerateContent.json") for n in names)
    assert any(n.endswith(":countTokens.json") for n in names)
    records = [json.loads(p.read_text()) for p in written]
    text = "".join(p.read_text() for p in written)
    assert rc.KEY not in text and '"x-goog-api-key": "<masked:' in text
    streamed = [r for r in records if r["path"].endswith(":streamGenerateContent")]
    assert streamed[0]["query"] == {"alt": ["sse"]}
    assert streamed[0]["recorder_response"]["sse_events"]
    assert any("Sunny, 21 C" in json.dumps(r["body"]) for r in records)

"""Qwen Code's stream-json output of one turn → neutral events (sans-IO).

What Qwen Code 0.15.10 prints (verified against a fake upstream, see
``docs/cli-workers.md``): ``system/init`` at the start of every turn,
``stream_event`` wrapping Anthropic-style deltas (no ``message_delta``), one
``assistant`` per upstream call, ``user`` with ``tool_result`` blocks in agent
mode, and a final ``result`` whose ``usage`` is the *session* total, so the
turn's tokens are the difference to the previous total.

An upstream HTTP error does not fail the turn: it arrives as assistant text
``[API Error: 401 Incorrect API key provided]`` (streamed as a text delta too)
and a ``result`` with ``is_error: false``. The parser holds back text that
could be the start of that marker, so an error never reaches the client as
an answer, and turns it into ``LoginRequired`` (401/403), ``RateLimited`` +
``TurnFailed`` (429) or ``TurnFailed``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from .events import (
    CliEvent, LoginRequired, PendingToolCall, RateLimited, SessionStarted, TextChunk, ThinkingChunk,
    ToolExecuted, ToolOutput, TurnFailed, TurnFinished, TurnUsage,
)

__all__ = ["QwenTurnParser", "UsageTotals", "classify_error", "is_login_error", "refused_continue"]

UsageTotals = dict[str, int]
_API_ERROR = "[API Error: "
_API_ERROR_RE = re.compile(r"^\[API Error: (?:(\d{3})\b)?\s*(.*?)\]?\s*$", re.S)
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens")
# what Qwen says when the account has no credentials at all
_LOGIN_HINTS = ("missing api key", "api key", "not logged in", "authenticat", "unauthorized",
                "qwen auth")


def is_login_error(message: str) -> bool:
    lowered = message.lower()
    return any(hint in lowered for hint in _LOGIN_HINTS)


def classify_error(text: str) -> list[CliEvent]:
    """The terminal events for an ``[API Error: ...]`` text or an error message."""
    match = _API_ERROR_RE.match(text.strip())
    status = int(match.group(1)) if match and match.group(1) else None
    message = (match.group(2) if match else text).strip() or text.strip()
    if status in (401, 403) or (status is None and is_login_error(message)):
        return [LoginRequired(f"qwen: {message}")]
    if status == 429:
        return [RateLimited(f"qwen: {message}"),
                TurnFailed("overloaded", f"qwen: {message}", status=status)]
    return [TurnFailed("upstream", f"qwen: {message}", status=status)]


class QwenTurnParser:
    """Feed one decoded stdout object at a time; collect the events it yields.
    ``done`` is true once a terminal event was produced; ``totals`` is then the
    session's cumulative usage, the baseline for the next turn."""

    def __init__(self, baseline: Mapping[str, int] | None = None, *,
                 client_tool_prefix: str | None = None) -> None:
        #: the model called client tools (held in the CLI): the step ends here
        self.pending = False
        self._client_prefix = client_tool_prefix
        self._client_calls: set[str] = set()  # their results came from the API client
        self.baseline: UsageTotals = dict(baseline or {})
        self.totals: UsageTotals = dict(self.baseline)
        self.done = False
        self._held = ""          # text that may still turn out to be "[API Error: ..."
        self._error: str | None = None
        self._streamed: set[str] = set()   # message ids whose text came as deltas
        self._current: str | None = None
        self._per_message: dict[str, Mapping[str, Any]] = {}

    def feed(self, obj: Mapping[str, Any]) -> list[CliEvent]:
        kind = obj.get("type")
        if kind == "system" and obj.get("subtype") == "init" and obj.get("session_id"):
            return [SessionStarted(str(obj["session_id"]), obj.get("model"))]
        if kind == "stream_event":
            return self._stream_event(obj.get("event") or {})
        if kind == "assistant":
            return self._assistant(obj.get("message") or {})
        if kind == "user":
            return self._tool_results(obj.get("message") or {})
        if kind == "result":
            self.pending = False
            return self._result(obj)
        return []

    # --- text, with the error marker held back ---

    def _text(self, text: str) -> list[CliEvent]:
        if self._error is not None:
            self._error += text
            return []
        self._held += text
        if self._held.startswith(_API_ERROR):
            self._error, self._held = self._held, ""
            return []
        if _API_ERROR.startswith(self._held):
            return []  # still a possible prefix of the marker
        out, self._held = self._held, ""
        return [TextChunk(out)]

    def _flush_held(self) -> list[CliEvent]:
        out, self._held = self._held, ""
        return [TextChunk(out)] if out else []

    def _stream_event(self, event: Mapping[str, Any]) -> list[CliEvent]:
        etype = event.get("type")
        if etype == "message_start":
            self._current = (event.get("message") or {}).get("id")
            return []
        if etype != "content_block_delta":
            return []
        delta = event.get("delta") or {}
        if delta.get("type") == "text_delta" and delta.get("text"):
            if self._current:
                self._streamed.add(self._current)
            return self._text(str(delta["text"]))
        if delta.get("type") == "thinking_delta" and delta.get("thinking"):
            return [ThinkingChunk(str(delta["thinking"]))]
        return []

    def _assistant(self, message: Mapping[str, Any]) -> list[CliEvent]:
        mid = str(message.get("id") or "")
        if isinstance(message.get("usage"), dict):
            self._per_message[mid] = message["usage"]
        events: list[CliEvent] = []
        streamed = mid in self._streamed
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and not streamed and block.get("text"):
                events += self._text(str(block["text"]))
            elif block.get("type") == "tool_use":
                events += self._flush_held()
                name, arguments = str(block.get("name")), json.dumps(block.get("input") or {})
                prefix = self._client_prefix
                if prefix and name.startswith(prefix):
                    self.pending = True
                    self._client_calls.add(str(block.get("id")))
                    events.append(PendingToolCall(str(block.get("id")), name[len(prefix):],
                                                  arguments))
                else:
                    events.append(ToolExecuted(str(block.get("id")), name, arguments))
        return events + self._flush_held()

    def _tool_results(self, message: Mapping[str, Any]) -> list[CliEvent]:
        content = message.get("content")
        if not isinstance(content, list):
            return []
        out: list[CliEvent] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result" \
                    and block.get("tool_use_id") not in self._client_calls:
                body = block.get("content")
                if isinstance(body, list):
                    body = "\n".join(str(b.get("text", "")) for b in body if isinstance(b, dict))
                out.append(ToolOutput(str(block.get("tool_use_id")), str(body or ""),
                                      bool(block.get("is_error"))))
        return out

    # --- the end of the turn ---

    def _usage(self, result: Mapping[str, Any]) -> TurnUsage | None:
        totals = result.get("usage")
        if not isinstance(totals, dict):
            return None
        self.totals = {k: int(totals.get(k) or 0) for k in _USAGE_KEYS}
        diff = {k: self.totals[k] - self.baseline.get(k, 0) for k in _USAGE_KEYS}
        if min(diff.values()) < 0:  # the totals restarted (a new process): count the calls
            diff = {k: sum(int(u.get(k) or 0) for u in self._per_message.values())
                    for k in _USAGE_KEYS}
        return TurnUsage(input_tokens=diff["input_tokens"], output_tokens=diff["output_tokens"],
                         cached_tokens=diff["cache_read_input_tokens"] or None)

    def _result(self, result: Mapping[str, Any]) -> list[CliEvent]:
        self.done = True
        if result.get("is_error"):
            error = result.get("error")
            message = (error.get("message") if isinstance(error, dict) else None) \
                or str(result.get("result") or result.get("subtype") or "error")
            return classify_error(message)
        usage = self._usage(result)
        if self._error is not None:
            return classify_error(self._error)
        events: list[CliEvent] = self._flush_held()
        if usage is not None:
            events.append(usage)
        events.append(TurnFinished("end_turn"))
        return events


def refused_continue(obj: Mapping[str, Any], request_id: str | None) -> bool:
    """The answer to ``request_id`` (a ``continue_last_turn``), refused or not
    understood (a CLI before 0.24)."""
    response = obj.get("response") or {}
    if request_id is None or response.get("request_id") != request_id:
        return False
    return response.get("subtype") == "error" or (response.get("response") or {}).get(
        "accepted") is False

"""Sans-IO: Claude Code's ``--output-format stream-json`` lines (with
``--verbose --include-partial-messages``) as neutral events.

Text, thinking and tool-use come from ``stream_event`` (the raw Anthropic
SSE events); ``assistant`` lines repeat them per content block and are only
read for the not-logged-in marker. Usage comes per API call
(``message_start`` / ``message_delta``), so each HTTP answer of a turn paused
on a client tool counts its own tokens; ``result.usage`` is the fallback.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from .claude_transcript import MCP_PREFIX
from .quota_events import claude_rate_limit
from .events import (CliEvent, LoginRequired, PendingToolCall, QuotaReport, RateLimited,
                     Retrying, SessionStarted, TextChunk, ThinkingChunk, ToolExecuted, ToolOutput,
                     ToolsPending, TurnFailed, TurnFinished, TurnUsage)

__all__ = ["ClaudeStream"]

_STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "refusal"}


class ClaudeStream:
    def __init__(self) -> None:
        self.interrupting = False
        self._blocks: dict[int, list[str]] = {}
        self._client_calls = 0
        self._client_ids: set[str] = set()  # their results are the client's, not the CLI's
        self._usage_seen = False
        self._logged_out = False
        #: the last rate_limit_event's gist since the driver last looked (None: none came)
        self.rate_info: tuple[str, ...] | None = None

    def new_turn(self) -> None:
        self._usage_seen = False
        self.interrupting = False

    def feed(self, obj: dict[str, Any]) -> list[CliEvent]:
        kind = obj.get("type")
        if kind == "stream_event":
            if obj.get("parent_tool_use_id"):
                return []  # a sub-agent's own stream
            return self._stream_event(obj.get("event") or {})
        if kind == "system":
            return self._system(obj)
        if kind == "assistant":
            message = obj.get("message") or {}
            if obj.get("error") == "authentication_failed" or message.get("model") == "<synthetic>":
                self._logged_out = obj.get("error") == "authentication_failed" or self._logged_out
            return []
        if kind == "user" and not obj.get("parent_tool_use_id"):
            return self._tool_outputs(obj)
        if kind == "rate_limit_event":
            return self._rate_limit(obj.get("rate_limit_info"))
        if kind == "result":
            return self._result(obj)
        return []

    # --- pieces ---------------------------------------------------------------------------

    def _rate_limit(self, info: Any) -> list[CliEvent]:
        """The window's numbers (a :class:`QuotaReport`) and, when ``rejected``,
        the limit (a :class:`RateLimited` with the reset)."""
        if not isinstance(info, dict):
            return []
        # what the driver compares with the account's last, to ask get_usage; an
        # event with every window's numbers (unifiedWindows) needs no asking
        if not isinstance(info.get("unifiedWindows"), dict):
            self.rate_info = tuple(str(info.get(k))[:64] for k in (
                "status", "rateLimitType", "utilization", "resetsAt"))
        windows = claude_rate_limit(info, time.time())
        events: list[CliEvent] = [QuotaReport(windows)] if windows else []
        if info.get("status") not in (None, "allowed", "allowed_warning"):
            reset = info.get("resetsAt")
            events.append(RateLimited("the account's rate limit was reached", reset_at=float(reset)
                                      if isinstance(reset, int | float)
                                      and not isinstance(reset, bool) else None))
        return events

    def _system(self, obj: dict[str, Any]) -> list[CliEvent]:
        subtype = obj.get("subtype")
        if subtype == "init" and obj.get("session_id"):
            return [SessionStarted(str(obj["session_id"]), obj.get("model"))]
        if subtype == "api_retry":
            status = obj.get("error_status")
            error = obj.get("error")
            if status == 401 or error == "authentication_failed":
                # the CLI would retry up to ten times (~90 s with an API key): stop at the first
                return [LoginRequired(f"the upstream refused the account's credentials ({status})")]
            return [Retrying(int(obj.get("attempt") or 0), obj.get("max_retries"), status, error)]
        return []

    def _stream_event(self, event: dict[str, Any]) -> list[CliEvent]:
        etype = event.get("type")
        if etype == "content_block_delta":
            delta = event.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                return [TextChunk(delta.get("text", ""))]
            if dtype == "thinking_delta":
                return [ThinkingChunk(delta.get("thinking", ""))]
            if dtype == "signature_delta":
                return [ThinkingChunk(signature=delta.get("signature", ""))]
            if dtype == "input_json_delta":
                block = self._blocks.get(event.get("index", -1))
                if block is not None:
                    block[2] += delta.get("partial_json", "")
            return []
        if etype == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                initial = block.get("input")
                self._blocks[event.get("index", -1)] = [
                    str(block.get("id")), str(block.get("name")),
                    "" if not initial else orjson.dumps(initial).decode()]
            return []
        if etype == "content_block_stop":
            tool = self._blocks.pop(event.get("index", -1), None)
            if tool is None:
                return []
            call_id, name, arguments = tool
            if name.startswith(MCP_PREFIX):
                self._client_calls += 1
                self._client_ids.add(call_id)
                return [PendingToolCall(call_id, name[len(MCP_PREFIX):], arguments or "{}")]
            return [ToolExecuted(call_id, name, arguments or "{}")]
        if etype == "message_start":
            self._blocks.clear()
            self._client_calls = 0
            usage = (event.get("message") or {}).get("usage") or {}
            if usage:
                self._usage_seen = True
                return [TurnUsage(input_tokens=usage.get("input_tokens"),
                                  cached_tokens=usage.get("cache_read_input_tokens"),
                                  cache_creation_tokens=usage.get("cache_creation_input_tokens"))]
            return []
        if etype == "message_delta":
            usage = event.get("usage") or {}
            if usage.get("output_tokens") is not None:
                self._usage_seen = True
                return [TurnUsage(output_tokens=usage["output_tokens"])]
            return []
        if etype == "message_stop" and self._client_calls:
            self._client_calls = 0
            return [ToolsPending()]
        return []

    def _tool_outputs(self, obj: dict[str, Any]) -> list[CliEvent]:
        content = (obj.get("message") or {}).get("content")
        if not isinstance(content, list):
            return []
        out: list[CliEvent] = []
        for block in content:
            if (isinstance(block, dict) and block.get("type") == "tool_result"
                    and self._client_ids.isdisjoint((block.get("tool_use_id"),))):
                out.append(ToolOutput(str(block.get("tool_use_id")), _text(block.get("content")),
                                      bool(block.get("is_error"))))
        return out

    def _result(self, obj: dict[str, Any]) -> list[CliEvent]:
        events: list[CliEvent] = []
        usage = obj.get("usage") or {}
        if not self._usage_seen and usage:
            events.append(TurnUsage(usage.get("input_tokens"), usage.get("output_tokens"),
                                    usage.get("cache_read_input_tokens"),
                                    usage.get("cache_creation_input_tokens")))
        text = str(obj.get("result") or obj.get("subtype") or "")
        if not obj.get("is_error") and obj.get("subtype") == "success":
            reason = obj.get("stop_reason")
            return [*events, TurnFinished(reason if reason in _STOP_REASONS else "end_turn")]
        status = obj.get("api_error_status")
        if self._logged_out or status == 401 or "Not logged in" in text:
            return [*events, LoginRequired(text[:300] or "not logged in")]
        if status == 429:
            return [*events, RateLimited(text[:300]), TurnFailed("rate_limit", text[:300], 429)]
        if self.interrupting:
            return [*events, TurnFailed("interrupted", "the turn was interrupted")]
        kind = "timeout" if obj.get("subtype") == "error_max_turns" else "upstream"
        return [*events, TurnFailed(kind, f"{obj.get('subtype')}: {text[:300]}",
                                    status if isinstance(status, int) else None)]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""

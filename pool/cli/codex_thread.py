"""One Codex thread as a :class:`~pool.cli.driver.Conversation`.

A step runs ``turn/start`` (or answers held tool calls) and then reads the
thread's queue until the turn ends or waits on the API client's tools:

- ``item/agentMessage/delta`` → text; reasoning deltas → thinking;
- ``item/tool/call`` (a server request for one of the thread's
  ``dynamicTools``) → :class:`PendingToolCall`, held unanswered. Codex asks for
  every parallel call of a model response before any answer; the thread is
  started with ``experimentalRawEvents``, so ``rawResponseItem/completed``
  (one per ``function_call``) and ``rawResponse/completed`` say how many
  there are, and the step ends with :class:`ToolsPending` once all are held
  (without raw events: when no further call came for ``tool_gather`` s);
- ``thread/tokenUsage/updated`` → ``last`` summed over the step;
- ``error`` → at the *first* 401 / ``unauthorized`` the turn is interrupted
  and the step ends with :class:`LoginRequired` (Codex would retry five
  times, ~6 s); at the first 429 / ``usageLimitExceeded`` /
  ``rateLimitExceeded`` likewise with :class:`RateLimited` +
  :class:`TurnFailed`; other retried errors → :class:`Retrying`;
- ``turn/completed`` → finished, interrupted or failed.

In agent mode the CLI's own items (``commandExecution``, ``fileChange``,
``mcpToolCall``) become executed tool-use/result pairs.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import structlog

from ..errors import kind_for_status
from .codex_config import tool_outputs, user_input
from .codex_rpc import Inbound, Notification, RpcClosed, RpcError, ServerRequest
from .events import (
    CliEvent, LoginRequired, PendingToolCall, RateLimited, Retrying, SessionStarted, TextChunk,
    ThinkingChunk, ToolAnswer, ToolExecuted, ToolOutput, ToolsPending, Turn, TurnFailed,
    TurnFinished, TurnUsage,
)

if TYPE_CHECKING:
    from .codex import CodexDriver

__all__ = ["CodexThread", "http_status", "error_class", "reset_at"]

log = structlog.get_logger(__name__)

_RECONNECT = re.compile(r"(\d+)/(\d+)")
_URL_TAIL = re.compile(r",? url: \S+$")
# 0.169.0: "… or try again at 7:38 AM."; 0.171.0: "… Try again at 10:31 AM."
_TRY_AGAIN = re.compile(r"try again at (\d{1,2}):(\d{2})\s*([AaPp][Mm])", re.IGNORECASE)
_THINKING = ("item/reasoning/summaryTextDelta", "item/reasoning/textDelta")
_RATE_INFOS = ("usageLimitExceeded", "rateLimitExceeded")


def http_status(info: Any) -> int | None:
    """The ``httpStatusCode`` inside a ``codexErrorInfo`` variant, if any."""
    if isinstance(info, Mapping):
        for value in info.values():
            if isinstance(value, Mapping) and isinstance(value.get("httpStatusCode"), int):
                return value["httpStatusCode"]
    return None


def error_class(error: Mapping[str, Any]) -> str:
    """``login``, ``rate`` or ``other`` for a Codex ``TurnError``."""
    info = error.get("codexErrorInfo")
    status = http_status(info)
    if info == "unauthorized" or status == 401:
        return "login"
    if info in _RATE_INFOS or status == 429:
        return "rate"
    return "other"


def _message(error: Mapping[str, Any]) -> str:
    """What went wrong: the upstream's words (a retry notice says them in
    ``additionalDetails``), without the provider URL Codex appends."""
    text = str(error.get("additionalDetails") or error.get("message") or "the codex turn failed")
    return _URL_TAIL.sub("", text)


def reset_at(message: str, now: float | None = None) -> float | None:
    """When a usage limit resets, from Codex's words ("… or try again at 7:38 AM.",
    a local time within the next day), as a Unix time."""
    found = _TRY_AGAIN.search(message)
    if found is None:
        return None
    hour, minute = int(found[1]) % 12 + (12 if found[3].upper() == "PM" else 0), int(found[2])
    now = time.time() if now is None else now
    today = time.localtime(now)
    at = time.mktime((today.tm_year, today.tm_mon, today.tm_mday, hour, minute, 0, 0, 0, -1))
    return at if at > now else at + 24 * 3600


def _turn_of(params: Mapping[str, Any], default: str | None) -> str | None:
    turn = params.get("turn")
    if isinstance(turn, Mapping) and "id" in turn:
        return turn["id"]
    return params.get("turnId", default)


def _usage(last: Mapping[str, Any]) -> TurnUsage:
    return TurnUsage(input_tokens=last.get("inputTokens"), output_tokens=last.get("outputTokens"),
                     cached_tokens=last.get("cachedInputTokens"),
                     cache_creation_tokens=last.get("cacheWriteInputTokens") or None)


def _add(a: TurnUsage | None, b: TurnUsage) -> TurnUsage:
    if a is None:
        return b

    def plus(x: int | None, y: int | None) -> int | None:
        return None if x is None and y is None else (x or 0) + (y or 0)

    return TurnUsage(plus(a.input_tokens, b.input_tokens), plus(a.output_tokens, b.output_tokens),
                     plus(a.cached_tokens, b.cached_tokens),
                     plus(a.cache_creation_tokens, b.cache_creation_tokens))


class CodexThread:
    """A thread of the account's app-server; one step at a time (the host's rule)."""

    def __init__(self, driver: CodexDriver, thread_id: str, model: str | None,
                 effort: str | None, queue: asyncio.Queue[Inbound | None],
                 tool_names: Mapping[str, str]) -> None:
        self._driver = driver
        self._rpc = driver.rpc
        self._id = thread_id
        self._model = model
        self._effort = effort
        self._queue = queue
        self._tool_names = tool_names  # Codex's name -> the client's
        self._turn_id: str | None = None
        self._held: dict[str, ServerRequest] = {}
        self._announced = False
        self._raw_events = False  # the server says when a model response is complete
        self._closed = False

    @property
    def session_id(self) -> str | None:
        return self._id

    @property
    def alive(self) -> bool:
        return not self._closed and not self._rpc.closed.is_set()

    # --- steps -----------------------------------------------------------------------------

    async def send(self, turn: Turn) -> AsyncIterator[CliEvent]:
        if not self._announced:
            self._announced = True
            yield SessionStarted(self._id, self._model)
        params: dict[str, Any] = {"threadId": self._id, "input": user_input(turn.messages)}
        if self._effort:
            params["effort"] = self._effort
        outputs = tool_outputs(turn.messages)
        try:
            if outputs:  # answers to calls of an injected history: history too
                await self._rpc.request("thread/inject_items",
                                        {"threadId": self._id, "items": outputs})
            result = await self._rpc.request("turn/start", params)
        except RpcError as exc:
            yield TurnFailed("invalid_request", exc.message)
            return
        except (RpcClosed, TimeoutError) as exc:
            yield TurnFailed("upstream", f"codex app-server: {exc}")
            return
        self._turn_id = result["turn"]["id"]
        async for event in self._pump():
            yield event

    async def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]:
        for answer in answers:
            request = self._held.pop(answer.call_id, None)
            if request is None:
                yield TurnFailed("invalid_request", f"no held tool call {answer.call_id!r}")
                return
            await self._rpc.respond(request.id, {
                "success": not answer.is_error,
                "contentItems": [{"type": "inputText", "text": b["text"]}
                                 for b in answer.blocks()]})
        async for event in self._pump():
            yield event

    async def _pump(self) -> AsyncIterator[CliEvent]:
        usage: TurnUsage | None = None
        asked = 0                    # client tool calls yielded in this step
        made = 0                     # client tool calls in the model response being read
        expected: int | None = None  # ... in the response once it is complete
        # Codex asks for parallel calls concurrently, in no fixed order: they are held here
        # and given to the client in the order the model wrote them (the raw items' order)
        pending: list[PendingToolCall] = []
        order: list[str] = []
        while True:
            gathering = asked > 0 and expected is None and not self._raw_events
            idle = self._driver.config.idle_timeout
            try:
                timeout = self._driver.options.tool_gather if gathering else idle
                item = await asyncio.wait_for(self._queue.get(), timeout)
            except TimeoutError:
                if not gathering:  # Codex said nothing at all for that long: hung
                    log.warning("codex.turn_stalled", thread=self._id, seconds=idle)
                    await self.interrupt()
                    yield TurnFailed("timeout", f"codex said nothing for {idle:g} s")
                    return
                for call in _in_order(pending, order):
                    yield call
                if usage is not None:
                    yield usage
                yield ToolsPending()  # no further call came: all of them are held
                return
            if item is None:
                self._closed = True
                yield TurnFailed("upstream", "the codex app-server exited during the turn")
                return
            if isinstance(item, ServerRequest):
                event = await self._on_request(item)
                if event is not None:
                    asked += 1
                    pending.append(event)
            elif _turn_of(item.params, self._turn_id) != self._turn_id:
                continue  # the tail of an earlier, interrupted turn
            elif item.method == "rawResponseItem/completed":
                self._raw_events = True
                raw = item.params.get("item") or {}
                if raw.get("type") == "function_call" and raw.get("name") in self._tool_names:
                    made += 1
                    order.append(str(raw.get("call_id")))
            elif item.method == "rawResponse/completed":
                self._raw_events = True
                expected, made = (made or None), 0
            elif item.method == "thread/tokenUsage/updated":
                usage = _add(usage, _usage(item.params["tokenUsage"]["last"]))
            else:
                events, done = await self._on_notification(item)
                if done:
                    for call in _in_order(pending, order):
                        yield call
                    pending.clear()
                for event in events:
                    if done and usage is not None and isinstance(event, TurnFinished):
                        yield usage
                    yield event
                if done:
                    return
            if expected is not None and asked >= expected > 0:
                # every client call of the model's response is held: the client's turn
                for call in _in_order(pending, order):
                    yield call
                if usage is not None:
                    yield usage
                yield ToolsPending()
                return

    async def _on_request(self, request: ServerRequest) -> PendingToolCall | None:
        params = request.params
        name = self._tool_names.get(str(params.get("tool")))
        if (request.method != "item/tool/call" or params.get("turnId") != self._turn_id
                or name is None):
            # chat mode offers nothing else to call; an approval nobody can give is declined
            await self._rpc.refuse(request.id, f"{request.method} is not available here")
            return None
        call_id = str(params.get("callId"))
        self._held[call_id] = request
        return PendingToolCall(call_id, name,
                               orjson.dumps(params.get("arguments") or {}).decode())

    async def _on_notification(self, note: Notification) -> tuple[list[CliEvent], bool]:
        method, params = note.method, note.params
        if method == "item/agentMessage/delta":
            return [TextChunk(params["delta"])], False
        if method in _THINKING:
            return [ThinkingChunk(params.get("delta", ""))], False
        if method in ("item/started", "item/completed"):
            return _agent_item(params.get("item") or {}, method == "item/started"), False
        if method == "error":
            return await self._on_error(params)
        if method == "turn/completed":
            return self._finished(params["turn"]), True
        return [], False

    async def _on_error(self, params: Mapping[str, Any]) -> tuple[list[CliEvent], bool]:
        error = params.get("error") or {}
        message = _message(error)
        kind = error_class(error)
        if kind == "other":
            if not params.get("willRetry"):
                return [], False  # turn/completed follows with the same error
            found = _RECONNECT.search(str(error.get("message", "")))
            attempt, most = (int(found[1]), int(found[2])) if found else (1, None)
            return [Retrying(attempt, most, http_status(error.get("codexErrorInfo")),
                             message)], False
        # first sign of a dead login or an exhausted quota: stop Codex's own retries
        await self.interrupt()
        self._turn_id = None
        return self._terminal_for(kind, error, message), True

    def _finished(self, turn: Mapping[str, Any]) -> list[CliEvent]:
        self._turn_id = None
        status = turn.get("status")
        if status == "completed":
            return [TurnFinished("end_turn")]
        if status == "interrupted":
            return [TurnFailed("interrupted", "the turn was interrupted")]
        error = turn.get("error") or {}
        return self._terminal_for(error_class(error), error, _message(error))

    @staticmethod
    def _terminal_for(kind: str, error: Mapping[str, Any], message: str) -> list[CliEvent]:
        if kind == "login":
            return [LoginRequired(message)]
        if kind == "rate":
            return [RateLimited(message, reset_at(message)), TurnFailed("overloaded", message, 429)]
        status = http_status(error.get("codexErrorInfo"))
        return [TurnFailed(kind_for_status(status) if status else "upstream", message, status)]

    # --- control ---------------------------------------------------------------------------

    async def interrupt(self) -> None:
        if self._turn_id is None or self._rpc.closed.is_set():
            return
        try:
            await self._rpc.request("turn/interrupt",
                                    {"threadId": self._id, "turnId": self._turn_id}, timeout=5)
        except (RpcError, RpcClosed, TimeoutError) as exc:
            log.warning("codex.interrupt_failed", thread=self._id, error=str(exc))

    async def close(self) -> None:
        if self._closed:
            return
        await self.interrupt()
        self._closed = True
        self._held.clear()
        self._driver.forget(self._id)
        if not self._rpc.closed.is_set():
            try:
                await self._rpc.request("thread/unsubscribe", {"threadId": self._id}, timeout=5)
            except (RpcError, RpcClosed, TimeoutError) as exc:
                log.info("codex.unsubscribe_failed", thread=self._id, error=str(exc))


def _agent_item(item: Mapping[str, Any], started: bool) -> list[CliEvent]:
    """Agent mode: Codex's own tool items as executed tool-use/result pairs."""
    kind, item_id = item.get("type"), str(item.get("id", ""))
    if kind == "commandExecution":
        if started:
            args = {"command": item.get("command"), "cwd": item.get("cwd")}
            return [ToolExecuted(item_id, "shell", orjson.dumps(args).decode())]
        failed = item.get("status") == "failed" or item.get("exitCode") not in (0, None)
        return [ToolOutput(item_id, str(item.get("aggregatedOutput") or ""), failed)]
    if kind == "fileChange":
        if started:
            return [ToolExecuted(item_id, "apply_patch",
                                 orjson.dumps({"changes": item.get("changes")}).decode())]
        return [ToolOutput(item_id, str(item.get("status")), item.get("status") == "failed")]
    if kind == "mcpToolCall":
        if started:
            name = f"{item.get('server')}.{item.get('tool')}"
            return [ToolExecuted(item_id, name, orjson.dumps(item.get("arguments")).decode())]
        result = orjson.dumps(item.get("result") or item.get("error")).decode()
        return [ToolOutput(item_id, result, item.get("status") == "failed")]
    return []


def _in_order(calls: list[PendingToolCall], order: list[str]) -> list[PendingToolCall]:
    """``calls`` in the order the model wrote them; calls the raw items did not name
    keep their arrival order, after the named ones."""
    rank = {call_id: i for i, call_id in enumerate(order)}
    return sorted(calls, key=lambda c: rank.get(c.call_id, len(rank)))

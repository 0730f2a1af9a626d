"""The worker child's side of a cli worker, the same for every CLI: which
conversation a request continues, how many stay warm, held tool calls, and
the account's status. See :mod:`pool.cli.driver` for the driver contract.

Each request is the whole conversation (stateless APIs). :func:`~pool.cli.history.split`
cuts it into history and the new turn; a warm conversation whose history
hash matches gets only the new turn (a *hit*); otherwise a new conversation
is opened, rebuilt from the history when there is one (a *rebuild*: the
driver loads a transcript, or the history is flattened into the first turn)
or empty (a *miss*). A conversation is reusable only after a clean end of a
step; an error, an interrupt or a client that leaves closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import structlog

from ..egress import proxy_reachable
from ..errors import BadRequest, GatewayError, Overloaded, UpstreamUnavailable
from ..model import (ChatRequest, Event, ExecutedTool, ExecutedToolPart, Finish, Message, ReasoningDelta, ReasoningEnd, Start,
                     TextDelta, TextPart, ToolCallDelta, ToolCallEnd, ToolCallPart, ToolCallStart,
                     Sampling, ToolResultPart, Usage)
from .driver import CliDriver, Conversation, DriverConfig
from ..quota import AccountQuota, QuotaWindow
from .events import (CliHealth, ConversationSetup, LoginRequired, PendingToolCall, QuotaReport,
                     RateLimited, Retrying, SessionStarted, TextChunk, ThinkingChunk, ToolAnswer, ToolExecuted,
                     ToolOutput, ToolsPending, Turn, TurnFailed, TurnFinished, TurnUsage)
from .failures import RATE_LIMIT_DEFAULT, client_error, naming
from .scrub import account_secrets, scrub
from .history import (answer_message, canonical_arguments, conversation_hash, flatten, split,
                      system_text, tool_result_text)

__all__ = ["CliHost", "DEFAULT_SYSTEM_PROMPT"]

log = structlog.get_logger("pool.cli")

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
_STOP = {"end_turn": "stop", "max_tokens": "length", "stop_sequence": "stop_sequence",
         "refusal": "content_filter"}
_RATE_LIMIT_DEFAULT = 60.0  # seconds of cooldown when the CLI does not say when the limit resets
#: a discarded conversation is dead within this (interrupt, EOF, SIGTERM, SIGKILL, reap)
DISCARD_DEADLINE = 10.0
_INTERRUPT_SHARE = 0.3  # of the deadline, at most, for a polite interrupt before closing
_MAX_QUOTA_WINDOWS = 16  # windows kept per account (the most recently seen)
_PROXY_CHECK = 2.0  # seconds for the egress proxy to take a connection, when a CLI asks for a login


@dataclass(eq=False)
class _Slot:
    conv: Conversation
    setup: ConversationSetup
    key: str | None = None           # conversation hash after the last clean step
    pending: tuple[str, ...] = ()    # tool call ids the client must answer
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)
    release: asyncio.TimerHandle | None = None


class CliHost:
    """Serves canonical requests with one driver's conversations."""

    def __init__(self, driver: CliDriver, config: DriverConfig, *,
                 conversation_idle: float = 900.0, login_recheck: float = 5.0) -> None:
        self.driver = driver
        self.config = config
        self.conversation_idle = conversation_idle
        self.login_recheck = login_recheck
        self.health = CliHealth(login="logging_in")
        self.cooldown_until: float | None = None
        self.quota = AccountQuota()  # the vendor's windows as last reported (pool/quota.py)
        if hasattr(driver, "on_quota"):  # reports outside a turn (get_usage, rateLimits/read)
            driver.on_quota = self.report_quota
        self.counts = {"hits": 0, "misses": 0, "rebuilds": 0}
        self._slots: list[_Slot] = []
        self._reaper: asyncio.Task[None] | None = None
        self._rechecker: asyncio.Task[None] | None = None
        # the credentials stamp a turn was refused with (a tuple: the stamp may be None)
        self._refused: tuple[object] | None = None
        self._closing: set[asyncio.Future[None]] = set()
        # max_conversations counts what is live, being opened and being killed
        self._opening = 0
        self._dying: set[_Slot] = set()
        self._freed = asyncio.Event()  # set (and replaced) whenever room may have been freed

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self.health = await self.driver.start()
        log.info("cli.started", worker=self.config.name, cli=self.config.cli,
                 version=self.health.version, login=self.health.login)
        self._reaper = asyncio.ensure_future(self._reap_forever())
        self._rechecker = asyncio.ensure_future(self._recheck_login_forever())

    async def aclose(self) -> None:
        for task in (self._reaper, self._rechecker):
            if task is not None:
                task.cancel()
        slots, self._slots = self._slots, []
        await asyncio.gather(*(s.conv.close() for s in slots), return_exceptions=True)
        await self.driver.stop()

    async def status(self, params: Any = None) -> dict[str, Any]:
        """What the gateway shows in ``/internal/workers`` and counts in ``/metrics``."""
        return {"cli": self.config.cli, "version": self.health.version,
                "account": self.health.account, "login": self.health.login,
                "conversations": len(self._slots),
                "held_tool_calls": sum(len(s.pending) for s in self._slots),
                "cooldown_until": self.cooldown_until if self._cooling() else None,
                "quota": self.quota.to_json(time.time()),
                "sessions": dict(self.counts)}

    def report_quota(self, windows: tuple[QuotaWindow, ...]) -> None:
        """Merge a :class:`QuotaReport`'s windows into the account's quota (at most
        :data:`_MAX_QUOTA_WINDOWS` are kept: the most recently seen)."""
        windows = tuple(w for w in windows if isinstance(w, QuotaWindow))
        if not windows:
            return
        quota = self.quota.merged(windows)
        if len(quota.windows) > _MAX_QUOTA_WINDOWS:
            kept = sorted(quota.windows, key=lambda w: w.seen_at)[-_MAX_QUOTA_WINDOWS:]
            quota = AccountQuota(tuple(w for w in quota.windows if w in kept))
        self.quota = quota
        log.info("cli.quota", worker=self.config.name, windows={
            w.name: round(w.used_percent, 1) for w in windows})

    def _spent_until(self) -> float | None:
        """When the account's spent windows reset, by its quota (a limit whose
        words give no reset: the vendor's window numbers still do)."""
        now = time.time()
        resets = [w.resets_at for w in self.quota.windows
                  if w.resets_at is not None and w.current(now) and w.used_percent >= 100]
        return max(resets) if resets else None

    def _cooling(self) -> bool:
        return self.cooldown_until is not None and time.time() < self.cooldown_until

    async def recheck_login(self) -> None:
        """Probe a logged-out account again: it is ready once the driver's health
        says so, and, when a turn was refused, once its credentials changed (the
        old ones would only be refused again)."""
        try:
            health = await self.driver.health()
        except Exception as exc:  # noqa: BLE001 - a failed probe leaves the state as it is
            log.info("cli.login_recheck_failed", worker=self.config.name,
                     error=type(exc).__name__)
            return
        if health.login != "ready":
            return
        stamp = health.detail.get("credentials")
        if self._refused is not None and (stamp is None or (stamp,) == self._refused):
            return
        self._refused = None
        self.health = health
        log.info("cli.logged_in", worker=self.config.name, account=health.account)

    async def _recheck_login_forever(self) -> None:
        while True:
            await asyncio.sleep(self.login_recheck)
            if self.health.login != "ready":
                await self.recheck_login()

    # --- one request ----------------------------------------------------------------------

    async def probe_login(self, params: Any = None) -> dict[str, Any]:
        """Try a logged-out account again (the gateway's account state machine
        calls this, with a backoff): a changed credentials file is enough; an
        account refused with credentials that cannot show a change (an API key,
        an ``apiKeyHelper``, a Qwen or jsonrpc account) gets a one-token turn,
        and is ready again once the upstream answers it."""
        if self.health.login != "ready":
            await self.recheck_login()
        # refused by the upstream (a turn, or the session a jsonrpc agent opens at start)
        refused = self._refused is not None or bool(self.health.detail.get("reason"))
        if self.health.login == "ready" or not refused:
            return await self.status()
        model = params.get("model") if isinstance(params, dict) else None
        probe = ChatRequest(model=str(model or ""), dialect="anthropic",
                            messages=(Message("user", (TextPart("Reply with one word."),)),),
                            sampling=Sampling(max_tokens=1))
        before = list(self._slots)
        try:
            async for _ in self.answer(probe, probe=True):
                pass
        except GatewayError as exc:
            log.info("cli.login_probe_refused", worker=self.config.name, code=exc.code)
        else:
            self._refused = None
            health = await self.driver.health()
            self.health = health if health.login == "ready" else CliHealth(
                login="ready", version=health.version, account=health.account,
                detail=health.detail)
            log.info("cli.logged_in", worker=self.config.name, account=self.health.account,
                     by="probe")
        for slot in [s for s in self._slots if s not in before]:  # nobody's conversation
            await self._discard(slot)
        return await self.status()

    async def answer(self, request: ChatRequest, *, probe: bool = False) -> AsyncIterator[Event]:
        if self.health.login != "ready" and not probe:
            raise UpstreamUnavailable(f"worker {self.config.name}: the account is "
                                      f"{self.health.login.replace('_', ' ')}",
                                      code="login_required", status=503)
        system = system_text(request.messages) or DEFAULT_SYSTEM_PROMPT
        history, new = split(request)
        if not new or new[-1].role != "user":
            raise BadRequest("The last message must be a user message (or tool results).",
                             param="messages")
        try:
            slot, steps = await self._route(request, system, history, new)
        except (BrokenPipeError, ConnectionError):  # the CLI died between two turns
            raise UpstreamUnavailable(f"worker {self.config.name}: the {self.config.cli} CLI "
                                      "went away; try again") from None
        slot.busy = True
        if slot.release is not None:
            slot.release.cancel()
            slot.release = None
        clean = False
        answer: list[Any] = []
        try:
            started = False
            async for event in self._translate(steps, answer, request.request_id):
                if not started:  # only once the CLI answered: a failure before can go elsewhere
                    started = True
                    yield Start(model=request.model)
                yield event
            clean = True
        finally:
            slot.busy = False
            slot.last_used = time.monotonic()
            if clean:
                slot.key = conversation_hash(request.key_name, request.model, system,
                                             request.tools, (*history, *new, answer_message(answer)))
                slot.pending = tuple(p.id for p in answer if isinstance(p, ToolCallPart))
                if slot.pending:
                    slot.release = asyncio.get_running_loop().call_later(
                        self.config.tool_timeout, self._release_held, slot)
            else:
                await self._discard(slot, interrupt=True)

    async def _route(self, request: ChatRequest, system: str, history: tuple[Message, ...],
                     new: tuple[Message, ...]) -> tuple[_Slot, AsyncIterator[Any]]:
        key = (conversation_hash(request.key_name, request.model, system, request.tools, history)
               if history else None)
        # what the CLI was started with must match too (Claude: flags and environment)
        knobs = (request.sampling.max_tokens, request.reasoning_effort, request.thinking_budget)
        slot = next((s for s in self._slots if key is not None and s.key == key and not s.busy
                     and s.conv.alive and _knobs(s.setup) == knobs), None)
        if slot is not None:
            answers = _tool_answers(new)
            note = _note(new)
            if slot.pending and {a.call_id for a in answers} >= set(slot.pending) \
                    and note is not None:
                if note:  # text after the results: it reaches the CLI with the last one
                    answers[-1] = dataclasses.replace(answers[-1], note=note)
                self.counts["hits"] += 1
                return slot, slot.conv.answer_tools(answers)
            if not slot.pending and not answers:
                self.counts["hits"] += 1
                try:
                    return slot, slot.conv.send(Turn(new))
                except (BrokenPipeError, ConnectionError):
                    await self._discard(slot)
                    raise
            await self._discard(slot)  # the client did not answer what the CLI waits for
        self.counts["rebuilds" if history else "misses"] += 1
        loads = self.driver.can_load_history
        setup = ConversationSetup(
            model=request.model, system=system, tools=request.tools,
            history=history if loads else (), max_tokens=request.sampling.max_tokens,
            effort=request.reasoning_effort, thinking_budget=request.thinking_budget,
            workspace=self.config.workspace(request.key_name))
        turn = new if loads or not history else (flatten(history, new),)
        await self._make_room()  # reserves the room: from here on it is counted as opening
        try:
            if setup.workspace:  # the key's workspace exists before its CLI looks for it
                self.config.sandbox.prepare(setup.workspace)
            conv = await self.driver.open(setup)
        except GatewayError:
            raise
        except Exception as exc:
            log.warning("cli.open_failed", worker=self.config.name, error=type(exc).__name__,
                        detail=self._scrub(str(exc)))
            raise UpstreamUnavailable(f"worker {self.config.name} could not start a "
                                      f"{self.config.cli} conversation") from None
        finally:
            self._opening -= 1
            self._notify_freed()
        slot = _Slot(conv, setup)
        self._slots.append(slot)
        return slot, conv.send(Turn(turn))

    def _in_use(self) -> int:
        return len(self._slots) + self._opening + len(self._dying)

    def _notify_freed(self) -> None:
        self._freed.set()
        self._freed = asyncio.Event()

    async def _make_room(self) -> None:
        """Reserve room for one more conversation: live, opening and dying ones all
        count, so concurrent first turns never run more than ``max_conversations``
        CLI processes. The least recently used idle one makes way (and is dead
        before its room is taken); with none idle, a dying one is waited for."""
        while self._in_use() >= self.config.max_conversations:
            idle = [s for s in self._slots if not s.busy]
            if idle:
                await self._discard(min(idle, key=lambda s: s.last_used))
                continue
            if not self._dying:
                raise Overloaded(f"worker {self.config.name} has no free conversation",
                                 retry_after=1)
            freed = self._freed  # taken before any await: no wake-up is lost
            try:
                async with asyncio.timeout(DISCARD_DEADLINE + 5):
                    await freed.wait()
            except TimeoutError:
                raise Overloaded(f"worker {self.config.name} has no free conversation",
                                 retry_after=1) from None
        self._opening += 1

    async def _translate(self, steps: AsyncIterator[Any], answer: list[Any],
                         request_id: str | None = None) -> AsyncIterator[Event]:
        """The driver's events as canonical ones; ``answer`` collects the parts a
        client will send back (text, executed tools, tool calls), in order."""
        text: list[str] = []
        ran: dict[str, ToolExecuted] = {}  # agent mode: calls the CLI runs, until their output
        usage = [0, 0, 0, 0]
        index = 0
        thinking = False
        async for ev in steps:
            kind = type(ev)
            if kind is TextChunk:
                text.append(ev.text)
                yield TextDelta(ev.text)
            elif kind is ThinkingChunk:
                if ev.text:
                    thinking = True
                    yield ReasoningDelta(ev.text)
                if ev.signature is not None:
                    thinking = False
                    yield ReasoningEnd(signature=ev.signature)
            elif kind is PendingToolCall:
                if thinking:
                    thinking = False
                    yield ReasoningEnd()
                answer.append(ToolCallPart(ev.call_id, ev.name, ev.arguments))
                yield ToolCallStart(index, ev.call_id, ev.name)
                yield ToolCallDelta(index, ev.arguments)
                yield ToolCallEnd(index)
                index += 1
            elif kind is ToolExecuted:
                # agent mode: the CLI runs it; shown with its output, nothing to answer
                ran[ev.call_id] = ev
            elif kind is ToolOutput:
                call = ran.pop(ev.call_id, None)
                if call is not None:
                    _flush_text(text, answer)
                    yield self._executed(call, ev.content, ev.is_error, answer)
            elif kind is TurnUsage:
                for i, value in enumerate((ev.input_tokens, ev.output_tokens, ev.cached_tokens,
                                           ev.cache_creation_tokens)):
                    usage[i] += value or 0
            elif kind is RateLimited:
                until = ev.reset_at or self._spent_until() or time.time() + RATE_LIMIT_DEFAULT
                if not self._cooling() or until > (self.cooldown_until or 0):
                    self.cooldown_until = until
                log.warning("cli.rate_limited", worker=self.config.name,
                            cooldown_until=self.cooldown_until)
            elif kind is QuotaReport:
                self.report_quota(ev.windows)
            elif kind is Retrying:
                log.info("cli.upstream_retry", worker=self.config.name, attempt=ev.attempt,
                         status=ev.status, error=self._scrub(str(ev.error)) if ev.error else None)
            elif kind is SessionStarted:
                pass
            elif kind in (TurnFinished, ToolsPending):
                _flush_text(text, answer)
                for call in ran.values():  # the CLI never reported an output
                    yield self._executed(call, "", False, answer)
                yield Usage(input_tokens=usage[0], output_tokens=usage[1],
                            cached_tokens=usage[2] or None,
                            cache_creation_tokens=usage[3] or None)
                yield Finish("tool_calls" if kind is ToolsPending else _STOP.get(ev.stop_reason, "stop"))
                return
            elif kind is LoginRequired:
                proxy = self.config.proxy  # a CLI that cannot reach its vendor may say "log in"
                if proxy is not None and not await proxy_reachable(proxy, _PROXY_CHECK):
                    log.warning("cli.proxy_down", worker=self.config.name, request_id=request_id)
                    raise UpstreamUnavailable(f"the egress proxy of worker {self.config.name} "
                                              "cannot be reached" + naming(request_id))
                self._refused = (self.health.detail.get("credentials"),)
                self.health = CliHealth(login="logged_out", version=self.health.version,
                                        account=self.health.account)
                log.warning("cli.logged_out", worker=self.config.name, request_id=request_id,
                            detail=self._scrub(ev.message))
                raise UpstreamUnavailable(f"worker {self.config.name}: the account is logged out"
                                          + naming(request_id), code="login_required", status=503)
            elif kind is TurnFailed:
                log.warning("cli.turn_failed", worker=self.config.name, request_id=request_id,
                            kind=ev.kind, status=ev.status, detail=self._scrub(ev.message))
                raise client_error(self.config.name, self.config.cli, ev, request_id,
                               self.cooldown_until if self._cooling() else None)
        raise UpstreamUnavailable(f"worker {self.config.name}: the {self.config.cli} CLI ended "
                                  "the turn without a result")

    def _scrub(self, text: str) -> str:
        """Vendor text for a log line: without the account's secrets, cut."""
        try:
            secrets = account_secrets(self.config.home, self.config.env)
        except Exception:  # noqa: BLE001 - the credential shapes still go
            secrets = set()
        return scrub(text, secrets)

    def _executed(self, call: ToolExecuted, output: str, is_error: bool,
                  answer: list[Any]) -> ExecutedTool:
        # canonical JSON: every dialect then shows (and a client sends back) the same text
        arguments = canonical_arguments(call.arguments)
        answer.append(ExecutedToolPart(call.call_id, call.name, arguments, output, is_error,
                                       self.config.cli))
        return ExecutedTool(call.call_id, call.name, arguments, output, is_error, self.config.cli)

    # --- keeping conversations ------------------------------------------------------------

    def _release_held(self, slot: _Slot) -> None:
        """The client never came back with the tool results: free the CLI."""
        slot.release = None
        if slot in self._slots and not slot.busy:
            log.info("cli.held_call_released", worker=self.config.name, calls=len(slot.pending))
            task = asyncio.ensure_future(self._discard(slot))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _discard(self, slot: _Slot, *, interrupt: bool = False) -> None:
        """Close ``slot``'s conversation within :data:`DISCARD_DEADLINE`; its room
        stays taken (``_dying``) until the close returned, i.e. until the CLI
        process is reaped (a close cut short by the deadline SIGKILLs and reaps
        on its way out, see :meth:`pool.cli.proc.JsonLineProcess.close`)."""
        with contextlib.suppress(ValueError):
            self._slots.remove(slot)
        if slot.release is not None:
            slot.release.cancel()
        self._dying.add(slot)
        try:
            async with asyncio.timeout(DISCARD_DEADLINE):
                if interrupt and slot.conv.alive:
                    with contextlib.suppress(TimeoutError):  # the close below is what counts
                        async with asyncio.timeout(DISCARD_DEADLINE * _INTERRUPT_SHARE):
                            await slot.conv.interrupt()
                await slot.conv.close()
        except Exception as exc:  # noqa: BLE001 - closing must not fail the request path
            log.warning("cli.close_failed", worker=self.config.name, error=type(exc).__name__)
        finally:
            self._dying.discard(slot)
            self._notify_freed()

    async def _reap_forever(self) -> None:
        interval = max(1.0, min(30.0, self.conversation_idle / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for slot in [s for s in self._slots if not s.busy and
                         (not s.conv.alive or now - s.last_used > self.conversation_idle)]:
                await self._discard(slot)


def _flush_text(text: list[str], answer: list[Any]) -> None:
    if text:
        answer.append(TextPart("".join(text)))
        text.clear()


def _knobs(setup: ConversationSetup) -> tuple[object, ...]:
    return (setup.max_tokens, setup.effort, setup.thinking_budget)


def _note(new: tuple[Message, ...]) -> str | None:
    """The text a client sent with its tool results ("" for none); None when the
    turn holds more than text (an image): only a rebuilt conversation takes that."""
    extra = [p for m in new for p in m.parts if not isinstance(p, ToolResultPart)]
    if not all(isinstance(p, TextPart) for p in extra):
        return None
    return "\n\n".join(p.text for p in extra if p.text)


def _tool_answers(new: tuple[Message, ...]) -> list[ToolAnswer]:
    return [ToolAnswer(p.call_id, tool_result_text(p), p.is_error)
            for m in new for p in m.parts if isinstance(p, ToolResultPart)]

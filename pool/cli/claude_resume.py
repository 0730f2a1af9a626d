"""A Claude conversation rebuilt from a history that ends in the model's tool
calls, whose next turn carries the client's results (a conversation that
moved from another account, a worker restart, a client that sends a tool
loop's history to a fresh session).

Claude Code 2.1.332 resumes a session that ends in a tool call by recording
that call as interrupted (an error result), and then drops a prompt's
``tool_result`` for it: the model got "(no content)". A session that ends
with the results instead gets a made-up assistant reply ("No response
requested.") before the next prompt. What the real binary takes cleanly (seen
against a fake upstream, docs/cli-workers.md) is the session written up to
and including the client's results, resumed with
``CLAUDE_CODE_RESUME_INTERRUPTED_TURN=1``: it is an interrupted turn, which
the CLI runs by itself at start, the results sent upstream as the client
sent them (followed by its meta prompt "Continue from where you left off.").

So such a conversation starts its CLI only once its first turn is known:
:class:`ResultsFirst` stands in for it until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Sequence

from ..model import Message
from .events import CliEvent, ToolAnswer, Turn, TurnFailed
from .history import results_message

if TYPE_CHECKING:
    from .claude import ClaudeConversation

__all__ = ["ResultsFirst"]

#: starts the CLI on the history and these messages after it (none: the history alone)
Start = Callable[[tuple[Message, ...]], Awaitable["ClaudeConversation"]]


class ResultsFirst:
    """The conversation until its first turn: that turn starts the CLI (with
    the results in the session, the CLI runs the turn by itself), and
    everything after goes to the started conversation."""

    def __init__(self, start: Start) -> None:
        self._start = start
        self._conv: ClaudeConversation | None = None
        self._closed = False

    @property
    def session_id(self) -> str | None:
        return self._conv.session_id if self._conv is not None else None

    @property
    def alive(self) -> bool:
        return self._conv.alive if self._conv is not None else not self._closed

    def send(self, turn: Turn) -> AsyncIterator[CliEvent]:
        if self._conv is not None:
            return self._conv.send(turn)
        return self._first(turn)

    def answer_tools(self, answers: Sequence[ToolAnswer]) -> AsyncIterator[CliEvent]:
        if self._conv is None:  # nothing is held before the first turn
            return _failed("no tool call is held: the conversation has not started")
        return self._conv.answer_tools(answers)

    async def interrupt(self) -> None:
        if self._conv is not None:
            await self._conv.interrupt()

    async def close(self) -> None:
        self._closed = True
        if self._conv is not None:
            await self._conv.close()

    async def _first(self, turn: Turn) -> AsyncIterator[CliEvent]:
        results = results_message(turn)
        if self._closed:
            yield TurnFailed("upstream", "the conversation was closed before it started")
            return
        try:
            self._conv = await self._start((results,) if results is not None else ())
        except Exception as exc:  # noqa: BLE001 - the host tells the client, the log the rest
            yield TurnFailed("upstream", f"could not start claude ({type(exc).__name__}: {exc})")
            return
        steps = self._conv.resumed_turn() if results is not None else self._conv.send(turn)
        async for event in steps:
            yield event


async def _failed(message: str) -> AsyncIterator[CliEvent]:
    yield TurnFailed("upstream", message)

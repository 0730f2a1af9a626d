"""What the fake ``claude`` does with a session it resumes (``--resume``), as
Claude Code 2.1.332 does (seen on the real binary against a fake upstream,
docs/cli-workers.md, "Claude Code"):

* only the ``user`` and ``assistant`` rows are messages (attachments, queue
  operations and the like are not);
* a tool call at the end with no result is recorded as interrupted: an
  error ``tool_result`` saying so, written to the session;
* a session that then ends with a user message gets the made-up assistant
  reply ``No response requested.`` (the next prompt is a new user message);
* a prompt's ``tool_result`` blocks that answer no open call are dropped, and
  a prompt left with nothing reaches the model as ``(no content)``;
* with ``CLAUDE_CODE_RESUME_INTERRUPTED_TURN`` set, a session that ends with
  the user's tool results is an interrupted turn: the CLI runs it at start,
  with the meta prompt ``Continue from where you left off.`` after them;
* consecutive messages of one role go upstream as one message.

Stdlib only (the fake runs as a script; this file sits next to it).
"""

from __future__ import annotations

from typing import Any, Mapping

INTERRUPTED = ("[Tool call interrupted: the session ended before this call's result was "
               "recorded, so its outcome is unknown. Check whether it took effect before "
               "relying on it or running it again.]")
NO_RESPONSE = "No response requested."
CONTINUE = "Continue from where you left off."
NO_CONTENT = "(no content)"


def messages_of(records: list[dict]) -> list[dict]:
    """The conversation in a session's rows."""
    return [{"role": r["message"]["role"], "content": r["message"]["content"]}
            for r in records if r.get("type") in ("user", "assistant") and "message" in r]


def _blocks(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content or () if isinstance(b, dict)]


def open_calls(messages: list[dict]) -> list[str]:
    """The tool calls of the last assistant message that no result answered yet."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        return []
    answered = {b.get("tool_use_id") for m in messages[last + 1:] for b in _blocks(m["content"])
                if b.get("type") == "tool_result"}
    return [b["id"] for b in _blocks(messages[last]["content"])
            if b.get("type") == "tool_use" and b.get("id") not in answered]


def interrupted_results(messages: list[dict]) -> list[dict]:
    """What the CLI records, at resume, for the calls left open."""
    return [{"type": "tool_result", "content": INTERRUPTED, "is_error": True, "tool_use_id": call}
            for call in open_calls(messages)]


def resumes_interrupted_turn(messages: list[dict], env: Mapping[str, str]) -> bool:
    return bool(env.get("CLAUDE_CODE_RESUME_INTERRUPTED_TURN")) and bool(messages) and \
        messages[-1]["role"] == "user" and any(
            b.get("type") == "tool_result" for b in _blocks(messages[-1]["content"]))


def ends_unanswered(messages: list[dict]) -> bool:
    """True when a resumed session needs the made-up reply before the next prompt."""
    return bool(messages) and messages[-1]["role"] == "user"


def prompt_content(content: Any, messages: list[dict]) -> Any:
    """A prompt as the CLI takes it: results for calls not open are dropped."""
    if isinstance(content, str):
        return content
    waiting = set(open_calls(messages))
    kept = [b for b in _blocks(content)
            if b.get("type") != "tool_result" or b.get("tool_use_id") in waiting]
    return kept or [{"type": "text", "text": NO_CONTENT}]


def merged(messages: list[dict]) -> list[dict]:
    """Consecutive messages of one role as one, as they go upstream."""
    out: list[dict] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"]:
            out[-1] = {"role": message["role"],
                       "content": _blocks(out[-1]["content"]) + _blocks(message["content"])}
        else:
            out.append(message)
    return out

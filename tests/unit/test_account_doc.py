"""docs/accounts.md's tables of the account state machine say what the code
does: every state of ``AccountState`` and no other, and for each action the
states ``ALLOWED`` lets it run in."""

from __future__ import annotations

import re
from pathlib import Path

from pool.cli.account import ALLOWED, AccountState, Action

DOC = Path(__file__).resolve().parents[2] / "docs" / "accounts.md"
_TICKED = re.compile(r"`([a-z_]+)`")


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## One owner of an account's life")
    return text[start:text.index("\n## ", start + 1)]


def _rows(header: str) -> list[list[str]]:
    """The rows of the table whose header line starts with ``header``."""
    lines = _section().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _running() -> set[str]:
    """What the doc calls *running*: the states it lists after ``*running*``."""
    found = re.search(r"\*running\*\s+is\s+(.*?)\)", _section(), re.S)
    assert found, "the doc no longer says what 'running' is"
    return set(_TICKED.findall(found.group(1)))


def test_the_doc_lists_every_state_and_no_other() -> None:
    documented = {_TICKED.findall(row[0])[0] for row in _rows("| state |")}
    assert documented == {s.value for s in AccountState}


def test_the_doc_allows_each_action_where_the_code_does() -> None:
    running = _running()
    assert running == {s.value for s in ALLOWED[Action.LOGIN]}  # the code's running set
    seen: dict[str, set[str]] = {}
    for action_cell, allowed_cell, _ in _rows("| action (who) |"):
        actions = _TICKED.findall(action_cell.split("(")[0])
        states = set(_TICKED.findall(allowed_cell.split("(")[0]))
        if allowed_cell.startswith("running"):
            states |= running
        for action in actions:
            seen[action] = states
    code = {a.value: {s.value for s in states} for a, states in ALLOWED.items()}
    assert seen == code

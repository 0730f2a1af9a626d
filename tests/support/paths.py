"""Where the tests find material kept in the repository."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Requests real clients sent (Claude Code, Codex, Qwen Code, the Python SDKs), kept in the
# repository so a clone of the project alone runs every test; see its README.md.
FIXTURES = REPO / "tests" / "fixtures" / "clients"

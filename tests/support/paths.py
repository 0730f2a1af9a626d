"""Where the tests find material that lives beside the checkout."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The recorded client requests live in the steering repo's shared/, which CI and
# every developer machine place beside the checkout.
FIXTURES = REPO.parent / "shared" / "fixtures" / "clients"

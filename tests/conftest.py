"""Fixtures shared by every test directory."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support import sdk_clients
from tests.support import tiny_model as tiny


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    """The SDK clients the test handed to ``closed_at_end`` are closed when it ends
    (see tests/support/sdk_clients.py: left to the garbage collector, their sockets
    fail a later test)."""
    yield
    sdk_clients.close_all()


@pytest.fixture(scope="session")
def tiny_model() -> tiny.TinyModel:
    """The random-weights tiny chat model (HF folder and GGUF), built once per checkout."""
    return tiny.tiny_model(trained=False)


@pytest.fixture(scope="session")
def tiny_model_trained() -> tiny.TinyModel:
    """The tiny chat model after its short training pass: it ends turns with <|im_end|>
    and calls the offered tool asked for (see ``KNOWN_TOOLS``). The first build takes
    about two minutes."""
    return tiny.tiny_model(trained=True)

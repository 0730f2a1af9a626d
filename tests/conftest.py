"""Fixtures shared by every test directory."""

from __future__ import annotations

import pytest

from tests.support import tiny_model as tiny


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

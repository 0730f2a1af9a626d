"""The unknown-model 404 names the models the key may use, capped."""

from __future__ import annotations

import pytest

from app.teams import LISTED_MODELS, model_not_found


@pytest.mark.parametrize("served, tail", [
    (None, "is not served here."),
    ([], "No model is served to this API key."),
    (["a", "b"], "Models served to this API key: a, b."),
    ([f"m{i}" for i in range(LISTED_MODELS)], f"m{LISTED_MODELS - 1}."),
    ([f"m{i}" for i in range(LISTED_MODELS + 3)],
     f"m{LISTED_MODELS - 1} and 3 more (GET /v1/models lists them all)."),
])
def test_message(served, tail):
    error = model_not_found("claude-opus-5-5", served)
    assert error.status == 404 and error.param == "model" and error.code == "model_not_found"
    assert error.message.startswith("The model 'claude-opus-5-5' does not exist")
    assert error.message.endswith(tail)

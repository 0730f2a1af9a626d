"""What a CLI cannot honour is refused with a 400 naming the parameter
(``n``, ``logprobs`` and token ids are refused by the worker's capabilities)."""

from __future__ import annotations

from ..errors import BadRequest
from ..model import ChatRequest

__all__ = ["check_request"]

_DEFAULT_SAMPLING = (None, 1.0)  # what OpenAI and Anthropic mean when nothing is said


def check_request(request: ChatRequest) -> None:
    sampling = request.sampling
    if sampling.temperature not in _DEFAULT_SAMPLING:
        _refuse("temperature")
    if sampling.top_p not in _DEFAULT_SAMPLING:
        _refuse("top_p")
    if sampling.top_k is not None:
        _refuse("top_k")
    if sampling.stop:
        _refuse("stop" if request.dialect != "anthropic" else "stop_sequences")
    if sampling.seed is not None:
        _refuse("seed")
    if sampling.stop_token_ids or sampling.ignore_eos:
        _refuse("stop_token_ids" if sampling.stop_token_ids else "ignore_eos")
    if request.response_format is not None and request.response_format.type != "text":
        _refuse("response_format")
    choice = request.tool_choice
    if choice is not None and choice.mode in ("required", "named"):
        _refuse("tool_choice")


def _refuse(param: str) -> None:
    raise BadRequest(f"'{param}' cannot be honoured by this model's worker (a coding CLI chooses "
                     "its own sampling); leave it out.", param=param)

"""Sampling defaults of a local worker: what a request gets for what it leaves out.

Three layers, the first that sets a value wins, as vLLM does with a model's
generation config:

1. the client's own value (``temperature``, ``top_p``, ``top_k``, ``max_tokens``);
2. the worker's configuration (``sampling_defaults = {temperature = …}``);
3. the model's own recommendation: ``generation_config.json`` of an HF
   folder, or the ``general.sampling.*`` keys of a GGUF file;
4. neutral values: temperature 1, top-p 1, no top-k, up to the context's end.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

__all__ = ["SamplingDefaults", "model_sampling_defaults", "resolve_defaults"]


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Defaults for what a request leaves out; ``None``: no default at this layer."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "SamplingDefaults":
        values = values or {}
        return cls(temperature=_num(values.get("temperature"), float),
                   top_p=_num(values.get("top_p"), float),
                   top_k=_num(values.get("top_k"), int),
                   max_tokens=_num(values.get("max_tokens"), int))

    def over(self, base: "SamplingDefaults") -> "SamplingDefaults":
        """These defaults, with ``base`` filling what they leave unset."""
        return replace(base, **{k: getattr(self, k) for k in self.__slots__
                                if getattr(self, k) is not None})

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}


def _num(value: Any, kind: type) -> Any:
    if value is None or isinstance(value, bool):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def model_sampling_defaults(model: str) -> SamplingDefaults:
    """What the model file recommends; empty when it says nothing (or is unreadable)."""
    if os.path.isdir(model):
        return _generation_config(os.path.join(model, "generation_config.json"))
    if model.lower().endswith(".gguf") and os.path.isfile(model):
        return _gguf_sampling(model)
    return SamplingDefaults()


def _generation_config(path: str) -> SamplingDefaults:
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return SamplingDefaults()
    if not isinstance(config, dict):
        return SamplingDefaults()
    if config.get("do_sample") is False:
        # greedy by the model's own word: sampling knobs there are inert
        return SamplingDefaults(temperature=0.0,
                                max_tokens=_num(config.get("max_new_tokens"), int))
    return SamplingDefaults(temperature=_num(config.get("temperature"), float),
                            top_p=_num(config.get("top_p"), float),
                            top_k=_num(config.get("top_k"), int),
                            max_tokens=_num(config.get("max_new_tokens"), int))


def _gguf_sampling(path: str) -> SamplingDefaults:
    from .ggufmeta import read_gguf_metadata

    try:
        meta = read_gguf_metadata(path, skip=("tokenizer.ggml.merges", "tokenizer.ggml.scores",
                                              "tokenizer.ggml.tokens",
                                              "tokenizer.ggml.token_type"))
    except (OSError, ValueError):
        return SamplingDefaults()
    return SamplingDefaults(temperature=_num(meta.get("general.sampling.temp"), float),
                            top_p=_num(meta.get("general.sampling.top_p"), float),
                            top_k=_num(meta.get("general.sampling.top_k"), int))


def resolve_defaults(configured: Mapping[str, Any] | None, model: str) -> SamplingDefaults:
    """The worker's effective defaults: its configuration over the model's own."""
    return SamplingDefaults.from_mapping(configured).over(model_sampling_defaults(model))

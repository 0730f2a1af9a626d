"""Chat templates: the Jinja2 programs models ship to turn messages into a prompt.

Rendered the way Hugging Face's ``apply_chat_template`` does (a sandboxed
environment, ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, ``tojson``
that keeps non-ASCII, ``raise_exception``, ``strftime_now``), so a template
gives the same text whichever engine serves the model: the GGUF's template
under llama.cpp and ``tokenizer_config.json``'s under Transformers agree.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Sequence

__all__ = ["ChatTemplate", "TemplateError"]


class TemplateError(Exception):
    """The template refused the conversation (its own ``raise_exception``)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template with the model's special tokens."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 extra: dict[str, Any] | None = None) -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self._template = env.from_string(source)
        self._constants = {"bos_token": bos_token, "eos_token": eos_token, **(extra or {})}

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        return self._template.render(messages=list(messages), tools=list(tools) if tools else None,
                                     add_generation_prompt=add_generation_prompt,
                                     **self._constants, **kwargs)

"""What a same-dialect pass-through may carry to an upstream on the
operator's account, per worker.

A client's own body goes on to an upstream of its dialect untouched but for
what this policy holds back: top-level fields the canonical model does not
cover (``service_tier``, ``store``, ``mcp_servers``, ``container``...) are
dropped unless the worker lists them in ``pass_fields``; ``anthropic-beta``
values are dropped unless they are on the default list below or in
``pass_betas``; a server tool (a ``tools`` entry with a vendor ``type``:
web search, web fetch, code execution, MCP) is refused with a 400 unless its
type is in ``server_tools``. The defaults are what real clients send
(``fixtures/clients``: Claude Code's fields and betas, the SDKs'), so they
work unchanged; what spends the operator's money on something else, or
reaches beyond the model, has to be named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from pool.errors import BadRequest

__all__ = ["PassPolicy", "ANTHROPIC_FIELDS", "OPENAI_CHAT_FIELDS", "DEFAULT_BETAS"]

ImageUrls = Literal["data_only", "fetch", "forward"]

#: Anthropic Messages fields passed by default (the canonical model's, and
#: Claude Code's ``thinking``, ``output_config``, ``context_management``)
ANTHROPIC_FIELDS = frozenset({
    "model", "messages", "system", "max_tokens", "metadata", "stop_sequences", "stream",
    "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config",
    "context_management",
})
#: OpenAI Chat Completions fields passed by default
OPENAI_CHAT_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
    "seed", "n", "tools", "tool_choice", "parallel_tool_calls", "response_format", "logprobs",
    "top_logprobs", "stream", "stream_options", "user", "safety_identifier", "reasoning_effort",
    "presence_penalty", "frequency_penalty", "logit_bias", "prompt_cache_key", "verbosity",
})
#: ``anthropic-beta`` names (without their date) passed by default: model and
#: protocol features real clients rely on, none that runs tools on the vendor's side
DEFAULT_BETAS = frozenset({
    "claude-code", "interleaved-thinking", "context-management", "context-1m", "effort",
    "prompt-caching", "prompt-caching-scope", "extended-cache-ttl", "redact-thinking",
    "structured-outputs", "thinking-token-count", "token-counting", "mid-conversation-system",
    "fine-grained-tool-streaming", "token-efficient-tools", "output-128k",
})
# tools[].type values that are the client's own tools, not the vendor's
_CLIENT_TOOL_TYPES = frozenset({None, "custom", "function"})
_BETA_DATE = re.compile(r"-\d{4}-?\d{2}-?\d{2}$")
_TOOL_DATE = re.compile(r"_\d{8}$")


@dataclass(frozen=True, slots=True)
class PassPolicy:
    """One worker's allow-lists (added to the defaults) and image URL rule."""

    pass_fields: frozenset[str] = frozenset()
    pass_betas: frozenset[str] = frozenset()
    server_tools: frozenset[str] = frozenset()
    image_urls: ImageUrls = "data_only"
    image_max_bytes: int = 20 * 1024 * 1024

    def body(self, raw: Mapping[str, Any], defaults: frozenset[str]) -> dict[str, Any]:
        """The client's body with only the fields allowed here, its server tools checked."""
        allowed = defaults | self.pass_fields
        if "web_search" in self.server_tools:
            allowed = allowed | {"web_search_options"}  # OpenAI's search models
        body = {k: v for k, v in raw.items() if k in allowed}
        tools = body.get("tools")
        if isinstance(tools, list):
            for i, tool in enumerate(tools):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if kind not in _CLIENT_TOOL_TYPES and not self._server_tool_allowed(kind):
                    raise BadRequest(f"tools[{i}].type: the server tool {kind!r} is not enabled "
                                     "on this gateway (the worker's server_tools).",
                                     param=f"tools[{i}].type")
        return body

    def _server_tool_allowed(self, kind: Any) -> bool:
        if not isinstance(kind, str):
            return False
        return kind in self.server_tools or _TOOL_DATE.sub("", kind) in self.server_tools

    def betas(self, header: str) -> str | None:
        """The ``anthropic-beta`` value with only the allowed betas, or None."""
        kept = []
        for beta in (b.strip() for b in header.split(",")):
            base = _BETA_DATE.sub("", beta)
            if beta and (base in DEFAULT_BETAS or beta in self.pass_betas
                         or base in self.pass_betas):
                kept.append(beta)
        return ",".join(kept) or None

"""What a client is told when a cli worker's turn fails: poolgate's own words
(the worker, a category, the upstream status, the request's id), never the
CLI's. A CLI may print its tokens anywhere; its words go to the worker's log
only, scrubbed (:mod:`pool.cli.scrub`)."""

from __future__ import annotations

import time

from ..errors import BadRequest, GatewayError, Overloaded, UpstreamTimeout, UpstreamUnavailable
from .events import TurnFailed

__all__ = ["RATE_LIMIT_DEFAULT", "client_error", "naming"]

RATE_LIMIT_DEFAULT = 60.0  # seconds of cooldown when the CLI does not say when the limit resets

_SAYS = {"timeout": "the {cli} CLI did not answer in time",
         "invalid_request": "the {cli} worker refused the request",
         "interrupted": "the turn was interrupted",
         "rate_limit": "the account is rate limited", "overloaded": "the account is rate limited"}


def naming(request_id: str | None) -> str:
    """Names the client's request in a message (its ``x-request-id``)."""
    return f" (request {request_id})" if request_id else ""


def client_error(worker: str, cli: str, ev: TurnFailed, request_id: str | None,
                 cooldown_until: float | None) -> GatewayError:
    """The error a client gets for ``ev`` (whose message is for the log only)."""
    says = _SAYS.get(ev.kind, "the {cli} CLI failed the turn").format(cli=cli)
    notes = [f"upstream status {ev.status}"] if ev.status else []
    notes += [f"request {request_id}"] if request_id else []
    message = f"worker {worker}: {says}" + (f" ({', '.join(notes)})" if notes else "")
    if cooldown_until is not None or ev.status == 429 or ev.kind == "rate_limit":
        retry = max(1.0, (cooldown_until or time.time() + RATE_LIMIT_DEFAULT) - time.time())
        return Overloaded(message, code="rate_limited", retry_after=round(retry))
    if ev.kind == "timeout":
        return UpstreamTimeout(message)
    if ev.kind == "invalid_request":
        return BadRequest(message)
    return UpstreamUnavailable(message)

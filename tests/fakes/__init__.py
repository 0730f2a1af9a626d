"""Fakes of other people's servers, driven over real sockets by tests."""

from .upstreams import FakeUpstream, Received, reasoning_for, rough_tokens, signature_for

__all__ = ["FakeUpstream", "Received", "reasoning_for", "rough_tokens", "signature_for"]

"""Response writers: one per response, owning what the client sees (headers, framing, timing)."""

from __future__ import annotations

from inference.writers.framing import ANTHROPIC_SSE, INTERACTIONS_SSE, OPENAI_SSE, RESPONSES_SSE, Framing
from inference.writers.response import ResponseClock, ResponseWriter, StreamObserver

__all__ = [
    "ANTHROPIC_SSE", "Framing", "INTERACTIONS_SSE", "OPENAI_SSE", "RESPONSES_SSE", "ResponseClock", "ResponseWriter", "StreamObserver",
]  # fmt: skip

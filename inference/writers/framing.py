"""How each surface frames a stream: the event that closes it, and how an error that happens after
the response started is reported in-band. The writer applies it; transports never frame.

- OpenAI chat and completions (spec 1, Streaming): ``data: <json>`` events closed by
  ``data: [DONE]``; an in-band error is ``data: {"error": {"message", "type": "internal_error"}}``
  followed by ``[DONE]``.
- Responses events close themselves (no sentinel): an in-band error is an ``error`` event.
- Anthropic Messages events close themselves too (``message_stop``, no sentinel): an in-band error is
  an ``error`` event, ``{"type": "error", "error": {"type": "api_error", "message"}}``.
- Gemini's Interactions events close themselves (``interaction.complete``): an in-band error is
  ``data: {"event_type": "error", "error": {"code", "message"}}``.
"""

from __future__ import annotations

from typing import Callable

import orjson

from inference.errors import GatewayError

__all__ = [
    "ANTHROPIC_SSE", "Framing", "INTERACTIONS_SSE", "OPENAI_SSE", "interactions_error_event", "RESPONSES_SSE", "anthropic_error_event", "openai_error_event",
    "responses_error_event",
]  # fmt: skip


class Framing:
    """One surface's stream framing. ``closing`` is appended at the end unless the stream already
    ends with ``closed_mark`` (a relayed worker usually sends it itself)."""

    __slots__ = ("name", "closing", "closed_mark", "error_event")

    def __init__(
        self, name: str, closing: bytes, closed_mark: bytes, error_event: Callable[[GatewayError], bytes]
    ) -> None:
        self.name = name
        self.closing = closing
        self.closed_mark = closed_mark
        self.error_event = error_event

    def closes(self, tail: bytes) -> bool:
        """Whether a stream ending in ``tail`` is already closed: its last event is the closing one
        (text inside an event that merely contains the mark does not count)."""
        return not self.closing or tail.rstrip().endswith(self.closed_mark)


def openai_error_event(error: GatewayError) -> bytes:
    """The OpenAI in-band error: ``{error: {message, type}}`` as one SSE data event (no code)."""
    return b"data: " + orjson.dumps({"error": {"message": error.message, "type": error.error_type}}) + b"\n\n"


OPENAI_SSE = Framing("openai", b"data: [DONE]\n\n", b"[DONE]", openai_error_event)


def responses_error_event(error: GatewayError) -> bytes:
    """The Responses API's in-band error: an ``error`` event (the stream has no closing sentinel)."""
    payload = {"type": "error", "code": str(error.code), "message": error.message, "param": error.param}
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


RESPONSES_SSE = Framing("responses", b"", b"", responses_error_event)


def interactions_error_event(error: GatewayError) -> bytes:
    """Gemini's Interactions in-band error: an ``error`` event of its stream (no sentinel follows)."""
    payload = {"event_type": "error", "error": {"code": str(error.code), "message": error.message}}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


INTERACTIONS_SSE = Framing("interactions", b"", b"", interactions_error_event)
"""Gemini's Interactions events (``data:`` lines), closed by ``interaction.complete`` itself."""
"""Responses API events (spec 2): ``event:`` and ``data:`` lines, closed by the terminal event itself."""


def anthropic_error_event(error: GatewayError) -> bytes:
    """The Messages API's in-band error (spec 1, Events): an ``error`` event of type api_error."""
    payload = {"type": "error", "error": {"type": "api_error", "message": error.message}}
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


ANTHROPIC_SSE = Framing("anthropic", b"", b"", anthropic_error_event)
"""Messages API events (spec 1): ``event:`` and ``data:`` lines, closed by ``message_stop`` itself."""

"""What request validation hands to the data plane."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ValidatedRequest"]


@dataclass(frozen=True, slots=True)
class ValidatedRequest:
    """A request body that passed the spec's rules.

    ``body`` is the parsed JSON object, possibly rewritten in place (max_tokens migration,
    reasoning_effort as a string, fields of other profiles dropped). ``modified`` is True when the
    body differs from what the client sent, so the raw bytes cannot be forwarded as they are.
    Unmodelled fields stay in ``body`` untouched.
    """

    body: dict[str, Any]
    model: str
    stream: bool
    modified: bool
    # What a surface's own validator made of the body (Responses: its ResponsesRequest), handed to
    # the served surface so it is not parsed twice; None for routes that keep nothing more.
    parsed: Any = None

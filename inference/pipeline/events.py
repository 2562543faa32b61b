"""API-neutral events: what the pipeline emits and every surface maps to its own wire format.

A surface (chat completions, completions, messages, responses, decisions) receives, per choice,
a sequence of these; the parsers produce the first three from the detokenized text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

__all__ = ["Event", "Finished", "ReasoningDelta", "TextDelta", "ToolCall", "ToolCallDelta", "Usage"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Ordinary content (chat ``content``, Anthropic text block, Responses output_text)."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text, without the markers that delimited it (chat ``reasoning_content``)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of tool call ``index`` (0-based, in order of appearance in the output).

    The first delta of a call carries ``id`` and ``name`` (and an empty ``arguments_delta``); later
    deltas carry only argument text. The ``arguments_delta`` strings of one call concatenate to
    one JSON object, as text (OpenAI's ``function.arguments``).
    """

    index: int
    id: str | None
    name: str | None
    arguments_delta: str = ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A whole tool call, as the non-streaming parse returns it. ``arguments`` is JSON text."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one response (reasoning tokens are part of completion tokens)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: proposed (0: the engine reported none)
    accepted_tokens: int = 0  # and accepted

    @staticmethod
    def sum(usages: Iterable[Usage]) -> Usage:
        """Several requests of one response (a completions prompt array, a response's tool turns):
        every count summed."""
        found = list(usages)
        return Usage(
            prompt_tokens=sum(u.prompt_tokens for u in found),
            completion_tokens=sum(u.completion_tokens for u in found),
            cached_tokens=sum(u.cached_tokens for u in found),
            reasoning_tokens=sum(u.reasoning_tokens for u in found),
            draft_tokens=sum(u.draft_tokens for u in found),
            accepted_tokens=sum(u.accepted_tokens for u in found),
        )


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of one choice. ``reason`` is the surface-neutral finish reason: stop, length,
    abort or tool_calls (a surface renders it, e.g. Anthropic's tool_use / end_turn)."""

    reason: str
    usage: Usage | None = None
    matched_stop: str | int | None = None


Event = Union[TextDelta, ReasoningDelta, ToolCallDelta, Finished]

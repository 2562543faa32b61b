"""Stage "usage": the token counts of one response from the engine's counters (spec 1, usage).

The prompt is counted once however many choices share it (n > 1), completions are summed over the
choices, cached tokens are the prompt tokens the engine served from its prefix cache, reasoning
tokens (part of the completion tokens) are the gateway's count where it parses the reasoning itself
(:class:`~inference.pipeline.reasoning.ReasoningTokenCount`), else what the engine reported: per
choice, the higher of the two.
"""

from __future__ import annotations

from inference.accounting import TokenUsage
from inference.pipeline.events import Usage
from inference.upstreams.engine import EngineOutput

__all__ = ["UsageTally", "token_usage"]


def token_usage(usage: Usage) -> TokenUsage:
    """A response's counts as the request's accounting takes them (docs/DECISIONS.md D66)."""
    return TokenUsage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.reasoning_tokens)


class UsageTally:
    """Running counts of one engine request; :meth:`usage` at any time is a snapshot."""

    __slots__ = ("prompt_tokens", "cached_tokens", "_completion", "_reasoning", "draft_tokens", "accepted_tokens")

    def __init__(self, prompt_tokens: int = 0) -> None:
        self.prompt_tokens = prompt_tokens  # the prompt as the gateway sent it, until the engine says
        self.cached_tokens = 0
        self._completion: dict[int, int] = {}
        self._reasoning: dict[int, int] = {}
        self.draft_tokens = 0
        self.accepted_tokens = 0

    def add(self, output: EngineOutput, reasoning_tokens: int = 0) -> None:
        """One engine output; ``reasoning_tokens``: the gateway's count of its choice's reasoning
        tokens so far (:attr:`ChoiceOutput.reasoning_tokens`)."""
        if output.prompt_tokens:
            self.prompt_tokens = output.prompt_tokens
        if output.cached_tokens > self.cached_tokens:
            self.cached_tokens = output.cached_tokens
        index = output.index
        # The running maxima written with comparisons (no max() calls: one add per engine message).
        completion = self._completion
        if output.completion_tokens > completion.get(index, 0) or index not in completion:
            completion[index] = output.completion_tokens
        reasoning = output.reasoning_tokens
        if reasoning_tokens > reasoning:
            reasoning = reasoning_tokens
        if reasoning and reasoning > self._reasoning.get(index, 0):
            self._reasoning[index] = reasoning
        if output.spec_draft_tokens:
            self.draft_tokens += output.spec_draft_tokens
            self.accepted_tokens += output.spec_accepted_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(self._completion.values())

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            reasoning_tokens=sum(self._reasoning.values()),
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
        )

    @staticmethod
    def combined(tallies: list[UsageTally]) -> Usage:
        """Several engine requests of one response (a completions prompt array): every count summed."""
        return Usage.sum(tally.usage() for tally in tallies)

"""How many of one choice's output tokens are reasoning (usage's ``reasoning_tokens``), counted as the
tokens stream, from the reasoning parser's verdict on their text.

The meaning is SGLang's (its scheduler's per-request count): the output tokens from the start of the
output through the token that closes the reasoning block (the end marker included, and a start
marker the model wrote); all of them while the output is still inside the block (an output cut
there is all reasoning); none when the output has no block (thinking off: the prompt closed it, or
the model answered without one).

The parser reads text, the count is of tokens: each step adds the ids whose text the parser has just
read. Where the end marker is one token (``</think>`` in every family that has it as a vocabulary
entry) the count ends exactly on it, wherever it falls in a multi-token step. Otherwise it ends
with the step in which the parser saw the block close (exact when the engine streams a token per
step). A step costs a length and, until the end marker is found, one scan of the step's ids; once
the count is settled, nothing.
"""

from __future__ import annotations

from typing import Sequence

from inference.pipeline.reasoning.base import ReasoningParser

__all__ = ["ReasoningTokenCount"]


class ReasoningTokenCount:
    """The reasoning tokens of one choice (see the module's docstring). Not thread-safe."""

    __slots__ = ("_parser", "_end_id", "_seen", "_end_at", "count", "settled")

    def __init__(self, parser: ReasoningParser, end_id: int | None) -> None:
        """``parser``: the choice's reasoning parser; ``end_id``: its end marker as one token id
        (None when it is not one token)."""
        self._parser = parser
        self._end_id = end_id
        self._seen = 0  # output ids read so far
        self._end_at: int | None = None  # output ids up to and including the first end marker
        self.count = 0
        self.settled = False
        """The count is final (the block closed, or there is none)."""

    def add(self, ids: Sequence[int]) -> None:
        """The output's next ``ids``, once the parser has read their text."""
        if self.settled:
            return
        end_id = self._end_id
        if end_id is not None and self._end_at is None and end_id in ids:
            self._end_at = self._seen + ids.index(end_id) + 1
        self._seen += len(ids)
        parser = self._parser
        if parser.in_reasoning:
            self.count = self._seen if self._end_at is None else self._end_at
        elif not parser.undecided:  # the block closed in these ids, or there is none
            if parser.had_reasoning:
                self.count = self._seen if self._end_at is None else self._end_at
            self.settled = True

"""The reasoning-block parser every ``<think>…</think>``-style family shares.

A parser is fed the detokenized text as it arrives, in chunks of any size and split anywhere
(inside a marker too), and returns :class:`ReasoningDelta` and :class:`TextDelta` events:

- Reasoning is one block at the start of the output: it opens with the family's start marker
  (leading whitespace allowed), or is already open because the rendered prompt opened it
  (DeepSeek R1, Qwen3 with thinking on by the reference gateway's rule, MiniMax, a V3.1 prompt
  ending in ``<think>``). When already open, a start marker the model writes anyway is swallowed.
  The block ends at the end marker; everything after it is content, markers included.
- Markers never appear in either stream. Text that may be the start of a marker is held back until
  it is decided, and released as ordinary text if it was not one.
- Whitespace at both ends of the reasoning and right after the end marker is dropped (the
  templates write ``<think>\\n…\\n</think>\\n\\n``); everything else passes through unchanged.
- ``separate_reasoning=False``: no parsing at all, the text is content exactly as generated
  (markers included).
- ``stream_reasoning=False``: the reasoning is held and emitted as one ReasoningDelta when the
  block closes (before any content), or at :meth:`finish` when the output ends inside it.
- An output that ends inside the block (a length cut) is reasoning up to its end.

:meth:`parse` runs the same machine over a whole text, so streaming and non-streaming agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from inference.pipeline.events import ReasoningDelta, TextDelta

__all__ = ["ParsedReasoning", "ReasoningParser", "prompt_reasoning_state"]

ReasoningEvent = ReasoningDelta | TextDelta


class _State(Enum):
    BEFORE = "before"  # nothing decided: a start marker may still come
    REASONING = "reasoning"
    CONTENT = "content"  # the block closed or never opened; markers are plain text now


@dataclass(frozen=True, slots=True)
class ParsedReasoning:
    """The non-streaming result: reasoning (empty when there was none) and content."""

    reasoning: str
    content: str


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest proper prefix of ``marker`` that ``text`` ends with."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def prompt_reasoning_state(prompt: str, start: str, end: str) -> bool | None:
    """Whether the rendered ``prompt`` leaves a reasoning block open (True), closed one at its
    end (False: e.g. Qwen3 with thinking off, DeepSeek V3.1 without thinking), or neither (None:
    the family's default applies). Only the prompt's tail after its last turn matters; a marker
    there is the generation prompt's."""
    tail = prompt.rstrip()
    opened, closed = tail.rfind(start), tail.rfind(end)
    if opened < 0 and closed < 0:
        return None
    if opened > closed and tail.endswith(start):
        return True
    if closed > opened and tail.endswith(end):
        return False
    return None


class ReasoningParser:
    """A streaming reasoning parser; a family subclasses it and sets the class variables."""

    start_marker: ClassVar[str] = "<think>"
    end_marker: ClassVar[str] = "</think>"
    starts_in_reasoning: ClassVar[bool] = False
    """The family's default when the prompt neither opened nor closed a block."""

    def __init__(
        self,
        *,
        separate_reasoning: bool = True,
        stream_reasoning: bool = True,
        in_reasoning: bool | None = None,
    ) -> None:
        """``in_reasoning``: whether the output starts inside the block (see
        :meth:`for_prompt`); None takes the family's default."""
        self._separate = separate_reasoning
        self._stream = stream_reasoning
        opened = self.starts_in_reasoning if in_reasoning is None else in_reasoning
        if separate_reasoning:
            self._state = _State.REASONING if opened else _State.BEFORE
        else:  # no parsing: the text is all content
            opened = False
            self._state = _State.CONTENT
        self._had_block = opened  # a reasoning block opened (by the prompt or the model)
        self._optional_start = opened  # the model may still write the start marker itself
        self._reasoning_started = False  # a non-space reasoning character was emitted
        self._skip_space = False  # drop whitespace right after the end marker
        self._buf = ""
        self._held: list[str] = []  # reasoning kept back when not streamed

    @classmethod
    def for_prompt(cls, prompt: str, **options: bool) -> ReasoningParser:
        """A parser for an output that continues the rendered ``prompt``."""
        return cls(in_reasoning=prompt_reasoning_state(prompt, cls.start_marker, cls.end_marker), **options)

    @property
    def in_reasoning(self) -> bool:
        return self._state is _State.REASONING

    @property
    def undecided(self) -> bool:
        """Whether the text so far leaves open if a block starts (only whitespace, or the start of
        the start marker, before any content)."""
        return self._state is _State.BEFORE

    @property
    def had_reasoning(self) -> bool:
        """Whether the output has a reasoning block (opened by the prompt or the model), so far."""
        return self._had_block

    @property
    def passes_text(self) -> bool:
        """Whether :meth:`feed` now hands any text on as one :class:`TextDelta` of it, and will until
        :meth:`finish` (no parsing, or after the block with nothing held: feed's first branches)."""
        return not self._separate or (self._state is _State.CONTENT and not self._skip_space and not self._buf)

    def feed(self, text: str) -> list[ReasoningEvent]:
        """Events for the next piece of generated text."""
        if not self._separate:
            return [TextDelta(text)] if text else []
        if self._state is _State.CONTENT and not self._skip_space and not self._buf:
            return [TextDelta(text)] if text else []  # after the block: what _advance gives, at once
        self._buf += text
        out: list[ReasoningEvent] = []
        self._advance(out, final=False)
        return out

    def finish(self) -> list[ReasoningEvent]:
        """Events for whatever is still held at the end of the output."""
        if not self._separate:
            return []
        out: list[ReasoningEvent] = []
        self._advance(out, final=True)
        if self._held:
            out.append(ReasoningDelta("".join(self._held)))
            self._held.clear()
        return out

    @classmethod
    def parse(cls, text: str, *, in_reasoning: bool | None = None, separate_reasoning: bool = True) -> ParsedReasoning:
        """The whole output at once: (reasoning, content)."""
        parser = cls(in_reasoning=in_reasoning, separate_reasoning=separate_reasoning)
        reasoning: list[str] = []
        content: list[str] = []
        for event in [*parser.feed(text), *parser.finish()]:
            (reasoning if isinstance(event, ReasoningDelta) else content).append(event.text)
        return ParsedReasoning("".join(reasoning), "".join(content))

    # --- the machine -------------------------------------------------------------------------

    def _reasoning(self, out: list[ReasoningEvent], text: str) -> None:
        if not text:
            return
        if self._stream:
            out.append(ReasoningDelta(text))
        else:
            self._held.append(text)

    def _close_reasoning(self, out: list[ReasoningEvent]) -> None:
        if self._held:
            out.append(ReasoningDelta("".join(self._held)))
            self._held.clear()

    def _advance(self, out: list[ReasoningEvent], *, final: bool) -> None:
        start, end = self.start_marker, self.end_marker
        while True:
            if self._state is _State.BEFORE:
                rest = self._buf.lstrip()
                if rest.startswith(start):
                    self._buf = rest[len(start) :]
                    self._state = _State.REASONING
                    self._had_block = True
                    continue
                if start.startswith(rest) and not final:
                    return  # only whitespace, or the start of the start marker, so far
                self._state = _State.CONTENT
                continue
            if self._state is _State.REASONING:
                if not self._reasoning_started:
                    self._buf = self._buf.lstrip()
                    if self._optional_start:
                        if self._buf.startswith(start):
                            self._buf = self._buf[len(start) :]
                            self._optional_start = False
                            continue
                        if start.startswith(self._buf) and not final:
                            return
                        self._optional_start = False
                at = self._buf.find(end)
                if at >= 0:
                    self._reasoning(out, self._buf[:at].rstrip())
                    self._close_reasoning(out)
                    self._buf = self._buf[at + len(end) :]
                    self._state = _State.CONTENT
                    self._skip_space = True
                    continue
                if final:
                    self._reasoning(out, self._buf.rstrip())
                    self._buf = ""
                    return
                keep = len(self._buf) - (_partial_suffix(self._buf, end) if end[0] in self._buf else 0)
                ready = self._buf[:keep].rstrip()
                if ready:
                    self._reasoning_started = True
                self._reasoning(out, ready)
                self._buf = self._buf[len(ready) :]
                return
            # content
            if self._skip_space:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return
                self._skip_space = False
            if self._buf:
                out.append(TextDelta(self._buf))
                self._buf = ""
            return

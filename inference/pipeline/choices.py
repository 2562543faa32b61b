"""Stages "detokenize → stop matching → parse" for one choice: engine outputs in, API-neutral
events out (:mod:`inference.pipeline.events`).

Per engine output of the choice:

1. the token ids are cut at the first stop token (the request's stop_token_ids and the model's
   end-of-sequence ids unless ignore_eos): the stop token is the choice's ``matched_stop`` and is
   never detokenized;
2. the ids become text incrementally (never half a UTF-8 character; skip_special_tokens applied);
3. stop strings are matched over the text (never split across chunks; trimmed unless no_stop_trim);
4. the reasoning parser splits reasoning from content, and the tool parser finds calls in the
   content; the output tokens whose text was reasoning are counted
   (:class:`~inference.pipeline.reasoning.ReasoningTokenCount`, usage's reasoning_tokens).

The choice ends at the engine's finish, or earlier at a stop token or stop string (the caller then
stops reading the engine, which aborts it). The last events are the parsers' held text and one
:class:`Finished` with the finish reason (``tool_calls`` when a call was found and the output
stopped on its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, cast

from inference.pipeline.events import Event, Finished, ReasoningDelta, TextDelta, ToolCallDelta
from inference.pipeline.reasoning import ReasoningParser, ReasoningTokenCount
from inference.pipeline.stops import StopMatcher, StopTokens
from inference.pipeline.tokenizers import ModelTokenizer
from inference.pipeline.tools.base import ToolEvent
from inference.upstreams.engine import EngineOutput, FinishReason, TokenLogprobs

__all__ = ["ChoiceOptions", "ChoiceOutput", "CallParser", "joined"]


class CallParser(Protocol):
    """A tool parser as the choice uses it (the families' ToolParser, or ConstrainedCalls)."""

    def feed(self, text: str) -> list[ToolEvent]: ...

    def finish(self) -> list[ToolEvent]: ...

    @property
    def has_tool_calls(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ChoiceOptions:
    """What every choice of one request shares."""

    stop_tokens: StopTokens
    stops: tuple[str, ...] = ()
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    kept_special_ids: frozenset[int] = frozenset()  # special tokens decoded anyway: the tool parser's markers
    reasoning: Callable[[], ReasoningParser] | None = None  # a fresh parser per choice, or None
    reasoning_end_id: int | None = None  # the reasoning parser's end marker as one token id, if it is one
    tools: Callable[[], CallParser] | None = None
    prompt_ids: tuple[int, ...] = ()  # the prompt's last ids give the detokenizer its context


class ChoiceOutput:
    """One choice of one request. Not thread-safe."""

    __slots__ = (
        "index", "_detokenizer", "_stops", "_stop_ids", "_matching", "_options", "_reasoning", "_reasoning_count", "_tools", "done",
        "completion_tokens", "reasoning_tokens", "logprobs", "text_length", "_plain",
    )  # fmt: skip

    def __init__(self, index: int, tokenizer: ModelTokenizer, options: ChoiceOptions) -> None:
        self.index = index
        self._options = options
        self._detokenizer = tokenizer.detokenizer(
            skip_special_tokens=options.skip_special_tokens, prompt_ids=options.prompt_ids,
            kept_special_ids=options.kept_special_ids,
        )
        self._stop_ids = options.stop_tokens.ids  # (StopTokens.find's set)
        self._stops = StopMatcher(options.stops, no_stop_trim=options.no_stop_trim)
        self._matching = self._stops.active  # stop strings to match (without, feed() hands text on as it is)
        self._reasoning = options.reasoning() if options.reasoning is not None else None
        self._reasoning_count = (
            ReasoningTokenCount(self._reasoning, options.reasoning_end_id) if self._reasoning is not None else None
        )
        self._tools = options.tools() if options.tools is not None else None
        self.done = False
        self.completion_tokens = 0
        self.reasoning_tokens = 0  # output tokens of the reasoning block so far
        self.logprobs: list[TokenLogprobs] = []
        self.text_length = 0  # characters of output text (content and reasoning) emitted
        # Every further text is plain content until the end (see :meth:`text_step`): set by step().
        self._plain = False

    def text_step(self, output: EngineOutput) -> str | None:
        """:meth:`step` of an output that can only add content text, as that text ("" for none): a
        one-token output without finish or logprobs, not a stop token, once the choice has no stop
        strings, no tool parser, reasoning parser past its block and its reasoning tokens counted.
        None for any other output, read by nothing yet: :meth:`step` takes it. Its events would be
        ``[TextDelta(text)]`` (none for "") and it updates the choice as step() would: the streamed
        chunk a token without the events' objects."""
        if not self._plain:
            return None
        ids = output.token_ids
        if len(ids) != 1 or output.finish is not None or output.logprobs is not None or ids[0] in self._stop_ids:
            return None
        counted = output.completion_tokens
        if counted > self.completion_tokens:
            self.completion_tokens = counted
        text = self._detokenizer.step_one(ids[0])
        if text:
            self.text_length += len(text)
        return text

    def step(self, output: EngineOutput) -> list[Event]:
        """The events one engine output of this choice adds (none once the choice is done)."""
        if self.done:
            return []
        ids = output.token_ids
        counted = output.completion_tokens
        # The engine's count before this output: a stop the gateway finds inside the output ends the
        # count at the token that made it, as an engine that applies the stop itself counts.
        before = counted - len(ids)
        if before < self.completion_tokens:
            before = self.completion_tokens
        matched_token: int | None = None
        stop_ids = self._stop_ids
        if not stop_ids:
            at: int | None = None
        elif len(ids) == 1:  # StopTokens.find's usual case, written out (one token per engine message)
            at = 0 if ids[0] in stop_ids else None
        else:
            at = self._options.stop_tokens.find(ids)
        if at is not None:
            matched_token = ids[at]
            ids = ids[:at]
            counted = min(counted, before + at + 1)  # through the stop token
        ending = at is not None or output.finish is not None
        detokenizer = self._detokenizer
        if len(ids) > 1 and self._matching:
            start = detokenizer.copy()
            text = detokenizer.step(ids)
            if ending:
                text += detokenizer.flush()
            if self._stops.completes(text):  # which token completed it: again, a token at a time
                self._detokenizer = start
                text, used = self._through_stop(ids, ending)
                ids = ids[:used]
                counted = min(counted, before + used)
            else:
                text = self._stops.feed(text)
        else:
            text = detokenizer.step(ids)
            if ending:
                text += detokenizer.flush()
            if self._matching:
                text = self._stops.feed(text)
        if counted > self.completion_tokens:
            self.completion_tokens = counted
        if output.logprobs is not None:
            self.logprobs.extend(output.logprobs[: len(ids)])
        matched_stop: str | int | None = self._stops.matched
        if matched_stop is None and ending:
            text += self._stops.flush()
        if not text:
            events: list[Event] = []
        else:  # _parse written out for a choice without tool calls (one call per engine message)
            self.text_length += len(text)
            reasoning = self._reasoning
            pieces: list[ReasoningDelta | TextDelta] = reasoning.feed(text) if reasoning is not None else [TextDelta(text)]
            # The parser's own new list taken as the events (no typing.cast call per message).
            events = pieces if self._tools is None else self._content(pieces)  # type: ignore[assignment]
        finishing = matched_stop is not None or ending
        if finishing:
            self.done = True
            self._plain = False
            events.extend(self._finish_parsers())
        counter = self._reasoning_count
        if counter is not None:
            counter.add(ids)
            self.reasoning_tokens = counter.count
            if counter.settled:
                self._reasoning_count = None  # final: nothing more to count
        if not finishing:
            if not self._plain and self._reasoning_count is None and self._tools is None and not self._matching:
                parser = self._reasoning
                self._plain = parser is None or parser.passes_text
            return events
        if matched_stop is not None or matched_token is not None:
            reason = FinishReason.STOP.value
            matched_stop = matched_stop if matched_stop is not None else matched_token
        else:
            assert output.finish is not None
            finish = output.finish
            reason = finish.reason.value
            matched_stop = finish.matched_stop_str if finish.matched_stop_str is not None else finish.matched_token_id
        if reason == FinishReason.STOP.value and self._tools is not None and self._tools.has_tool_calls:
            reason = "tool_calls"
        events.append(Finished(reason, None, matched_stop))
        return events

    def _through_stop(self, ids: tuple[int, ...], ending: bool) -> tuple[str, int]:
        """Detokenize and match ``ids`` a token at a time up to the one that completes a stop string:
        the text to send and how many of ``ids`` that took."""
        detokenizer, stops = self._detokenizer, self._stops
        sent: list[str] = []
        for used in range(1, len(ids) + 1):
            sent.append(stops.feed(detokenizer.step(ids[used - 1 : used])))
            if stops.matched is not None:
                return "".join(sent), used
        if ending:
            sent.append(stops.feed(detokenizer.flush()))
        return "".join(sent), len(ids)

    def _parse(self, text: str) -> list[Event]:
        if not text:
            return []
        self.text_length += len(text)
        # feed() hands back a list of its own making: taken as it is (no copy per token).
        pieces: list[ReasoningDelta | TextDelta] = (
            self._reasoning.feed(text) if self._reasoning is not None else [TextDelta(text)]
        )
        return self._content(pieces)

    def _finish_parsers(self) -> list[Event]:
        pieces: list[ReasoningDelta | TextDelta] = list(self._reasoning.finish()) if self._reasoning is not None else []
        events = self._content(pieces)
        if self._tools is not None:
            events.extend(self._tools.finish())
        return events

    def _content(self, pieces: list[ReasoningDelta | TextDelta]) -> list[Event]:
        if self._tools is None:
            return cast(list[Event], pieces)  # the caller's own new list: no copy
        events: list[Event] = []
        for piece in pieces:
            if isinstance(piece, TextDelta):
                events.extend(self._tools.feed(piece.text))
            else:
                events.append(piece)
        return events


def joined(events: list[Event]) -> tuple[str, str, list[ToolCallDelta]]:
    """Content, reasoning and tool-call deltas of a list of events (non-streamed answers)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCallDelta] = []
    for event in events:
        if isinstance(event, TextDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallDelta):
            calls.append(event)
    return "".join(content), "".join(reasoning), calls

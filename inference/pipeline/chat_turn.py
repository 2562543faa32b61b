"""One chat turn on an engine worker, up to the pipeline's API-neutral events: what every surface that
renders messages with the chat template shares (chat completions; Responses and Messages map their
requests to a chat body and their events from these).

:class:`ChatTurn` is made once per request from the surface's typed :class:`~inference.pipeline.turn.Turn`
(its mapper resolved the tool choice and sampling once); the prompt is rendered and tokenized once
per tokenizer. :meth:`open`
starts the turn on a worker (the attempts loop calls it; a failure before the first output is
retried elsewhere) and hands a :class:`TurnRun` (the worker's tokenizer, the choices' options and the
prompt) to the caller's ``deliver``, which reads ``(choice, events)`` pairs from :func:`turn_events`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import AsyncIterator, Awaitable, Callable

from common import tracing
from inference.accounting import Delivered
from inference.pipeline.choices import CallParser, ChoiceOptions, ChoiceOutput
from inference.pipeline.events import Event
from inference.pipeline.prompt import check_prompt, render_turn, tokenize
from inference.pipeline.reasoning import REASONING_PARSERS, ReasoningParser
from inference.pipeline.stops import StopTokens
from inference.pipeline.tool_choice import ConstrainedCalls
from inference.pipeline.turn import Turn
from inference.pipeline.tools import TOOL_PARSERS
from inference.routing.workers import WorkerHandle
from inference.pipeline.engine_answer import EngineAnswer, open_generation
from inference.pipeline.target import EngineTarget
from inference.upstreams.engine import EngineOutput, EngineRequest, SamplingParams
from inference.writers import ResponseWriter

__all__ = ["ChatTurn", "TargetOf", "TurnRun", "TurnDeliver", "turn_events", "turn_step"]


@dataclass(frozen=True, slots=True)
class _Prompt:
    text: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TurnRun:
    """A turn started on one worker: what reading its outputs needs."""

    target: EngineTarget
    options: ChoiceOptions
    prompt_text: str
    prompt_tokens: int
    n: int

    def choices(self) -> list[ChoiceOutput]:
        return [ChoiceOutput(index, self.target.tokenizer, self.options) for index in range(self.n)]


TargetOf = Callable[[WorkerHandle, str], EngineTarget]
"""How a turn finds its engine target on a worker for a model (the served surfaces bind
:func:`inference.served.base.engine_target` to their data plane)."""

TurnDeliver = Callable[[TurnRun, AsyncIterator[EngineOutput], ResponseWriter], Awaitable[Delivered]]
"""A surface's reader of a started turn (the writer is the surface's own)."""


async def turn_events(
    outputs: AsyncIterator[EngineOutput], choices: list[ChoiceOutput], count: Callable[[EngineOutput, int], None]
) -> AsyncIterator[tuple[ChoiceOutput, list[Event]]]:
    """Each engine output as the events it adds to its choice (``count`` sees every output with its
    choice's reasoning tokens so far, before the events are handed on: a :meth:`UsageTally.add`);
    ends when every choice is done (the caller's closing of ``outputs`` then aborts the engine if it
    was not)."""
    async for output in outputs:
        choice, events = turn_step(output, choices, count)
        yield choice, events
        if choice.done and all(other.done for other in choices):  # only a step that ended its choice can end all
            return


def turn_step(
    output: EngineOutput, choices: list[ChoiceOutput], count: Callable[[EngineOutput, int], None]
) -> tuple[ChoiceOutput, list[Event]]:
    """One engine output of :func:`turn_events`, for a reader that iterates the outputs itself (one
    generator less per token); it ends when the returned choice is done and every other one is."""
    choice = choices[output.index]
    events = choice.step(output)
    if choice.completion_tokens < output.completion_tokens:  # a stop inside the output ended the count
        output = replace(output, completion_tokens=choice.completion_tokens)
    count(output, choice.reasoning_tokens)
    return choice, events


class ChatTurn:
    """One chat-shaped request's turn (see the module's docstring)."""

    def __init__(self, target_of: TargetOf, turn: Turn, request_id: str) -> None:
        self.target_of = target_of
        self.turn = turn
        self.request_id = request_id
        self.sampling: SamplingParams = turn.sampling
        self._prompts: dict[tuple[str, str | None], _Prompt] = {}

    async def _prompt(self, target: EngineTarget) -> _Prompt:
        """The rendered and tokenized prompt for ``target``'s tokenizer (once per tokenizer)."""
        key = (target.tokenizer.path, target.spec.chat_template)
        prompt = self._prompts.get(key)
        if prompt is None:
            if tracing.ENABLED:  # a render span under the attempt's (D74)
                span = tracing.child("render", {"gateway.tokenizer": target.tokenizer.path})
                try:
                    rendered = render_turn(self.turn, target.tokenizer, target.family)
                finally:
                    span.end()
            else:
                rendered = render_turn(self.turn, target.tokenizer, target.family)
            prompt = _Prompt(rendered.text, await tokenize(target.tokenizer, rendered.text))
            self._prompts[key] = prompt
        return prompt

    async def open(self, worker: WorkerHandle, deliver: TurnDeliver) -> EngineAnswer:
        """Start the turn on ``worker``; return once the engine's first output arrived."""
        turn = self.turn
        target = self.target_of(worker, turn.model)
        prompt = await self._prompt(target)
        check_prompt(len(prompt.ids), target.spec.context_length, turn.prompt_param)
        sampling = self.sampling
        engine_request = EngineRequest(
            request_id=self.request_id,
            input_ids=prompt.ids,
            sampling=sampling,
            # Stop strings are matched here: stream from the engine so a match stops it early.
            stream=turn.stream or bool(sampling.stop),
            original_text=prompt.text,
            data_parallel_rank=target.worker.dp_rank,  # under --dp-aware: this attempt's rank
        )
        run = TurnRun(target, self._choice_options(target, prompt), prompt.text, len(prompt.ids), sampling.n)
        return await open_generation(target.client, engine_request, partial(deliver, run))

    def _choice_options(self, target: EngineTarget, prompt: _Prompt) -> ChoiceOptions:
        turn = self.turn
        output = turn.output
        choice = turn.tool_choice
        spec = target.spec
        reasoning: Callable[[], ReasoningParser] | None = None
        reasoning_end_id: int | None = None
        if spec.reasoning_parser and output.separate_reasoning:
            parser_class = REASONING_PARSERS.get(spec.reasoning_parser)
            stream_reasoning = output.stream_reasoning or not turn.stream
            reasoning = partial(parser_class.for_prompt, prompt.text, stream_reasoning=stream_reasoning)
            reasoning_end_id = target.tokenizer.single_token_id(parser_class.end_marker)
        tools: Callable[[], CallParser] | None = None
        # The detokenize settings: skip_special_tokens as asked, except the special tokens the
        # tool parser reads (its markers), which skipping would remove before it sees them.
        kept_special_ids: frozenset[int] = frozenset()
        if choice.constrained:
            tools = partial(ConstrainedCalls, choice)
        elif choice.parses_calls and spec.tool_parser:
            tool_parser = TOOL_PARSERS.get(spec.tool_parser)
            tools = partial(tool_parser, tools=choice.schemas())
            kept_special_ids = target.tokenizer.special_ids(tool_parser.special_markers)
        return ChoiceOptions(
            stop_tokens=StopTokens.build(
                self.sampling.stop_token_ids, target.tokenizer.eos_token_ids, ignore_eos=self.sampling.ignore_eos
            ),
            stops=self.sampling.stop,
            no_stop_trim=output.no_stop_trim,
            skip_special_tokens=self.sampling.skip_special_tokens,
            kept_special_ids=kept_special_ids,
            reasoning=reasoning,
            reasoning_end_id=reasoning_end_id,
            tools=tools,
            prompt_ids=prompt.ids,
        )

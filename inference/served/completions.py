"""POST /v1/completions on engine workers (spec 1, text completion request).

Each prompt of a prompt array is its own engine request (all started at once); a prompt is text
(tokenized with the model's special tokens, as the engines do) or token ids. Choice ``i`` of prompt
``k`` is ``choices[k * n + i]``. ``echo`` puts the prompt before the completion, ``suffix`` after it.
No chat template and no parsers: the text is the model's, with stop strings matched as for chat.
Usage sums every prompt's counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, AsyncIterator

import orjson

from inference import errors
from inference.pipeline.choices import ChoiceOptions, ChoiceOutput, joined
from inference.pipeline.events import Event, Finished, ReasoningDelta, TextDelta
from inference.pipeline.prompt import check_prompt, tokenize
from inference.pipeline.sampling import completion_sampling
from inference.pipeline.stops import StopTokens
from inference.accounting import Delivered
from inference.pipeline.usage import UsageTally, token_usage
from inference.routing.workers import WorkerHandle
from inference.pipeline.target import EngineTarget
from inference.served.base import ServedRequest, ServedSurface, engine_target, uuid4_hex
from inference.pipeline.chat_turn import turn_events, turn_step
from inference.pipeline.engine_answer import EngineAnswer, open_generations
from inference.served.openai_shapes import completion_logprobs, usage_json
from inference.upstreams.engine import EngineOutput, EngineRequest
from inference.upstreams.failures import UpstreamFailure
from inference.writers import ResponseWriter

__all__ = ["ServedCompletion"]

_OPENAI_FINISH = {"abort": "stop", "tool_calls": "stop"}
_TEXT_TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n'  # a text chunk's bytes after its text


@dataclass(frozen=True, slots=True)
class _Prompt:
    text: str
    ids: tuple[int, ...]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(item) is int and item >= 0 for item in value)


def prompt_items(prompt: Any) -> list[str | list[int]]:
    """The prompts of a ``prompt`` field: a string, token ids, or an array of either."""
    if isinstance(prompt, str):
        return [prompt]
    if _is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and all(isinstance(item, str) or _is_ids(item) for item in prompt):
        return list(prompt)
    raise errors.invalid_request("prompt must be a string, an array of strings, or token IDs", "prompt")


class ServedCompletion(ServedSurface):
    def __init__(self, request: ServedRequest) -> None:
        super().__init__(request)
        body = request.body
        self.items = prompt_items(body.get("prompt"))
        self.sampling = completion_sampling(body)
        self.n = self.sampling.n
        self.id = f"cmpl-{uuid4_hex()}"
        self.created = int(time.time())
        self.model = request.model or request.requested_model
        self.echo = body.get("echo") is True
        suffix = body.get("suffix")
        self.suffix = suffix if isinstance(suffix, str) else ""
        options = body.get("stream_options") or {}
        self.include_usage = options.get("include_usage") is True
        self._prompts: dict[str, list[_Prompt]] = {}

    async def _prompts_for(self, target: EngineTarget) -> list[_Prompt]:
        found = self._prompts.get(target.tokenizer.path)
        if found is None:
            found = []
            vocab = target.tokenizer.vocab_size
            for item in self.items:
                if isinstance(item, str):
                    found.append(_Prompt(item, await tokenize(target.tokenizer, item, add_special_tokens=True)))
                else:
                    if any(token >= vocab for token in item):
                        raise errors.invalid_request(f"prompt token IDs must be below the vocabulary size {vocab}", "prompt")
                    found.append(_Prompt(target.tokenizer.decode(item, skip_special_tokens=False), tuple(item)))
            self._prompts[target.tokenizer.path] = found
        return found

    async def open(self, worker: WorkerHandle) -> EngineAnswer:
        target = engine_target(self.request.dp, worker, self.request.model)
        prompts = await self._prompts_for(target)
        for prompt in prompts:
            check_prompt(len(prompt.ids), target.spec.context_length, "prompt")
        stream = self.request.stream or bool(self.sampling.stop)
        requests = [
            EngineRequest(
                request_id=self.id if len(prompts) == 1 else f"{self.id}-{k}",
                input_ids=prompt.ids,
                sampling=self.sampling,
                stream=stream,
                original_text=prompt.text,
                data_parallel_rank=target.worker.dp_rank,  # under --dp-aware: this attempt's rank
            )
            for k, prompt in enumerate(prompts)
        ]
        stop_tokens = StopTokens.build(
            self.sampling.stop_token_ids, target.tokenizer.eos_token_ids, ignore_eos=self.sampling.ignore_eos
        )
        options = [
            ChoiceOptions(
                stop_tokens=stop_tokens,
                stops=self.sampling.stop,
                no_stop_trim=self.request.body.get("no_stop_trim") is True,
                skip_special_tokens=self.sampling.skip_special_tokens,
                prompt_ids=prompt.ids,
            )
            for prompt in prompts
        ]
        deliver = partial(self._stream if self.request.stream else self._whole, target, prompts, options)
        return await open_generations(target.client, requests, deliver, choices_per_request=self.n)

    def _choices(self, target: EngineTarget, options: list[ChoiceOptions]) -> list[ChoiceOutput]:
        return [ChoiceOutput(index, target.tokenizer, options[index // self.n]) for index in range(len(options) * self.n)]

    def _usage(self, tallies: list[UsageTally]) -> dict[str, Any]:
        usage = usage_json(UsageTally.combined(tallies))
        usage.pop("prompt_tokens_details", None)  # completions' usage: the three counts
        return usage

    def _tally(self, tallies: list[UsageTally], output: EngineOutput, reasoning_tokens: int) -> None:
        tallies[output.index // self.n].add(output, reasoning_tokens)

    # --- one text_completion object ---------------------------------------------------------------

    async def _whole(
        self, target: EngineTarget, prompts: list[_Prompt], options: list[ChoiceOptions],
        outputs: AsyncIterator[EngineOutput], writer: ResponseWriter,
    ) -> Delivered:  # fmt: skip
        choices = self._choices(target, options)
        events: list[list[Event]] = [[] for _ in choices]
        tallies = [UsageTally(len(prompt.ids)) for prompt in prompts]
        writer.usage_so_far = lambda: token_usage(UsageTally.combined(tallies))
        async for choice, added in turn_events(outputs, choices, partial(self._tally, tallies)):
            events[choice.index].extend(added)
        rendered = []
        for choice in choices:
            content, _, _ = joined(events[choice.index])
            prefix = prompts[choice.index // self.n].text if self.echo else ""
            finished = next((e for e in events[choice.index] if isinstance(e, Finished)), None)
            reason = finished.reason if finished is not None else "stop"
            rendered.append({
                "index": choice.index,
                "text": prefix + content + self.suffix,
                "logprobs": completion_logprobs(target.tokenizer, choice.logprobs, len(prefix)) if self.sampling.logprobs else None,
                "finish_reason": _OPENAI_FINISH.get(reason, reason),
                "matched_stop": finished.matched_stop if finished is not None else None,
            })  # fmt: skip
        body = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": rendered,
            "usage": self._usage(tallies),
        }
        await writer.whole(200, b"application/json", orjson.dumps(body))
        return Delivered(True, token_usage(UsageTally.combined(tallies)))

    # --- a stream of text_completion chunks ---------------------------------------------------------

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _text_head(self, index: int) -> bytes:
        """:meth:`_choice_chunk`'s bytes for choice ``index`` up to its text (no logprobs, no finish)."""
        return b"".join((
            b'data: {"id":', orjson.dumps(self.id), b',"object":"text_completion","created":', orjson.dumps(self.created),
            b',"model":', orjson.dumps(self.model), b',"choices":[{"index":%d,"text":' % index,
        ))  # fmt: skip

    def _choice_chunk(
        self, index: int, text: str, logprobs: Any = None, finish_reason: str | None = None, matched: Any = None
    ) -> bytes:
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["matched_stop"] = matched
        return self._chunk([choice])

    async def _stream(
        self, target: EngineTarget, prompts: list[_Prompt], options: list[ChoiceOptions],
        outputs: AsyncIterator[EngineOutput], writer: ResponseWriter,
    ) -> Delivered:  # fmt: skip
        choices = self._choices(target, options)
        tallies = [UsageTally(len(prompt.ids)) for prompt in prompts]
        writer.usage_so_far = lambda: token_usage(UsageTally.combined(tallies))
        logprobs_sent = [0] * len(choices)
        offsets = [0] * len(choices)
        await writer.open_stream()
        if self.echo:
            await writer.chunk(b"".join(self._choice_chunk(c.index, prompts[c.index // self.n].text) for c in choices))
        out = bytearray()
        count = partial(self._tally, tallies)
        # A text chunk per token straight from per-choice bytes (as _choice_chunk writes it without
        # logprobs) when the choice's text_step reads the output.
        plain = not self.sampling.logprobs
        heads = [self._text_head(choice.index) for choice in choices]
        send_event = writer.event
        dumps = orjson.dumps
        final = b""  # the last step's bytes, when it ended every choice (sent with the stream's end)
        try:
            async for output in outputs:  # turn_events written out: one generator less per token
                if plain:
                    choice = choices[output.index]
                    text = choice.text_step(output)
                    if text is not None:
                        count(output, choice.reasoning_tokens)
                        if text:
                            offsets[output.index] += len(text)
                            await send_event(heads[output.index] + dumps(text) + _TEXT_TAIL)
                        continue
                choice, added = turn_step(output, choices, count)
                out.clear()
                for event in added:
                    logprobs = None
                    if self.sampling.logprobs and len(choice.logprobs) > logprobs_sent[choice.index]:
                        fresh = choice.logprobs[logprobs_sent[choice.index] :]
                        logprobs = completion_logprobs(target.tokenizer, fresh, offsets[choice.index])
                        logprobs_sent[choice.index] = len(choice.logprobs)
                    if isinstance(event, (TextDelta, ReasoningDelta)):
                        offsets[choice.index] += len(event.text)
                        out += self._choice_chunk(choice.index, event.text, logprobs)
                    elif isinstance(event, Finished):
                        reason = _OPENAI_FINISH.get(event.reason, event.reason)
                        out += self._choice_chunk(choice.index, self.suffix, logprobs, reason, event.matched_stop)
                # Only a step that ended its choice can end all: its bytes go out with the usage
                # chunk and the closing event, one body message for the stream's end (the same bytes).
                if choice.done and all(other.done for other in choices):
                    final = bytes(out)
                    break
                if out:
                    await writer.chunk(bytes(out))
        except UpstreamFailure as failure:
            await writer.break_stream(errors.stream_failed(failure.detail))
            return Delivered(False, token_usage(UsageTally.combined(tallies)))
        if self.include_usage:
            final += self._chunk([], self._usage(tallies))
        if final:
            await writer.chunk(final, last=True)
        else:
            await writer.end_stream()
        return Delivered(True, token_usage(UsageTally.combined(tallies)))

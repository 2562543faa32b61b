"""POST /generate on engine workers: SGLang's native route, served by the gateway (text or
input_ids in, the sampling_params SGLang names, ``stream``, ``return_logprob``).

Answer: ``{text, output_ids, meta_info: {id, finish_reason: {type, matched} | null, prompt_tokens,
completion_tokens, cached_tokens}}``; with ``n`` > 1 or a list of texts or id lists, a list of such
objects. A stream sends, per output of a choice, the object so far (the whole text so far, as
SGLang streams it, with ``index``), then ``data: [DONE]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, AsyncIterator, Mapping

import orjson

from inference import errors
from inference.pipeline.choices import ChoiceOptions, ChoiceOutput
from inference.pipeline.events import Event, Finished, ReasoningDelta, TextDelta
from inference.pipeline.prompt import check_prompt, tokenize
from inference.pipeline.stops import StopTokens
from inference.accounting import Delivered
from inference.pipeline.usage import UsageTally, token_usage
from inference.routing.workers import WorkerHandle
from inference.pipeline.target import EngineTarget
from inference.served.base import ServedRequest, ServedSurface, engine_target, uuid4_hex
from inference.pipeline.engine_answer import EngineAnswer, open_generations
from inference.upstreams.engine import Constraint, ConstraintKind, EngineOutput, EngineRequest, SamplingParams
from inference.upstreams.failures import UpstreamFailure
from inference.writers import ResponseWriter

__all__ = ["ServedGenerate", "native_sampling"]

_NUMBERS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_INTEGERS = ("top_k", "max_new_tokens", "min_new_tokens", "n")
_FLAGS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens")
_CONSTRAINTS = (("regex", ConstraintKind.REGEX), ("ebnf", ConstraintKind.GRAMMAR), ("json_schema", ConstraintKind.JSON_SCHEMA))


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def native_sampling(params: Any, *, logprobs: bool = False, top_logprobs: int = 0) -> SamplingParams:
    """SGLang's ``sampling_params`` object as the engine's sampling; 400 for a wrong type."""
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise errors.invalid_request("sampling_params must be an object", "sampling_params")
    values: dict[str, Any] = {"max_new_tokens": 128}
    for key in _NUMBERS:
        if params.get(key) is not None:
            if not _number(params[key]):
                raise errors.invalid_request(f"sampling_params.{key} must be a number", f"sampling_params.{key}")
            values[key] = float(params[key])
    for key in _INTEGERS:
        if params.get(key) is not None:
            if type(params[key]) is not int or params[key] < (1 if key == "n" else -1 if key == "top_k" else 0):
                raise errors.invalid_request(f"sampling_params.{key} must be a valid integer", f"sampling_params.{key}")
            values[key] = params[key]
    for key in _FLAGS:
        if params.get(key) is not None:
            if not isinstance(params[key], bool):
                raise errors.invalid_request(f"sampling_params.{key} must be a boolean", f"sampling_params.{key}")
            values[key] = params[key]
    stop = params.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(item, str) for item in stops):
            raise errors.invalid_request("sampling_params.stop must be a string or an array of strings", "sampling_params.stop")
        values["stop"] = tuple(item for item in stops if item)
    stop_ids = params.get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, list) or not all(type(item) is int for item in stop_ids):
            raise errors.invalid_request("sampling_params.stop_token_ids must be an array of integers", "sampling_params.stop_token_ids")
        values["stop_token_ids"] = tuple(stop_ids)
    for key, kind in _CONSTRAINTS:
        value = params.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise errors.invalid_request(f"sampling_params.{key} must be a string", f"sampling_params.{key}")
            values["constraint"] = Constraint(kind, value)
            break
    return SamplingParams(**values, logprobs=logprobs, top_logprobs=top_logprobs)


@dataclass(frozen=True, slots=True)
class _Prompt:
    text: str
    ids: tuple[int, ...]


class ServedGenerate(ServedSurface):
    def __init__(self, request: ServedRequest) -> None:
        super().__init__(request)
        body = request.body
        self.batch = False
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise errors.invalid_request("give exactly one of text and input_ids", "text")
        items: list[Any]
        if text is not None:
            self.batch = isinstance(text, list)
            items = text if self.batch else [text]
            if not items or not all(isinstance(item, str) for item in items):
                raise errors.invalid_request("text must be a string or a non-empty array of strings", "text")
        else:
            self.batch = isinstance(ids, list) and bool(ids) and all(isinstance(item, list) for item in ids)
            items = list(ids) if self.batch and isinstance(ids, list) else [ids]
            if not all(isinstance(item, list) and item and all(type(t) is int and t >= 0 for t in item) for item in items):
                raise errors.invalid_request("input_ids must be token IDs or an array of token ID arrays", "input_ids")
        self.items = items
        return_logprob = body.get("return_logprob") is True
        top = body.get("top_logprobs_num") or 0
        if type(top) is not int or top < 0:
            raise errors.invalid_request("top_logprobs_num must be a non-negative integer", "top_logprobs_num")
        self.sampling = native_sampling(body.get("sampling_params"), logprobs=return_logprob, top_logprobs=top)
        self.n = self.sampling.n
        rid = body.get("rid")
        self.id = rid if isinstance(rid, str) and rid else uuid4_hex()
        self.no_stop_trim = (body.get("sampling_params") or {}).get("no_stop_trim") is True

    async def open(self, worker: WorkerHandle) -> EngineAnswer:
        target = engine_target(self.request.dp, worker, self.request.model)
        vocab = target.tokenizer.vocab_size
        prompts: list[_Prompt] = []
        for item in self.items:
            if isinstance(item, str):
                prompts.append(_Prompt(item, await tokenize(target.tokenizer, item, add_special_tokens=True)))
            else:
                if any(token >= vocab for token in item):
                    raise errors.invalid_request(f"input_ids must be below the vocabulary size {vocab}", "input_ids")
                prompts.append(_Prompt(target.tokenizer.decode(item, skip_special_tokens=False), tuple(item)))
        param = "text" if isinstance(self.items[0], str) else "input_ids"
        for prompt in prompts:
            check_prompt(len(prompt.ids), target.spec.context_length, param)
        requests = [
            EngineRequest(
                request_id=self.id if len(prompts) == 1 else f"{self.id}-{k}",
                input_ids=prompt.ids,
                sampling=self.sampling,
                stream=self.request.stream or bool(self.sampling.stop),
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
                no_stop_trim=self.no_stop_trim,
                skip_special_tokens=self.sampling.skip_special_tokens,
                prompt_ids=prompt.ids,
            )
            for prompt in prompts
        ]
        deliver = partial(self._deliver, target, prompts, options)
        return await open_generations(target.client, requests, deliver, choices_per_request=self.n)

    def _object(
        self, index: int, text: str, choice: ChoiceOutput, tally: UsageTally, finished: Finished | None,
        output_ids: list[int], tokenizer_logprobs: bool,
    ) -> dict[str, Any]:  # fmt: skip
        finish = None
        if finished is not None:
            finish = {"type": finished.reason, "matched": finished.matched_stop}
            if finished.reason in ("length", "abort"):
                finish = {"type": finished.reason, **({"length": choice.completion_tokens} if finished.reason == "length" else {})}
        usage = tally.usage()
        meta: dict[str, Any] = {
            "id": self.id if self.n == 1 and len(self.items) == 1 else f"{self.id}-{index}",
            "finish_reason": finish,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": choice.completion_tokens,
            "cached_tokens": usage.cached_tokens,
        }
        if tokenizer_logprobs:
            meta["output_token_logprobs"] = [[item.logprob, item.token_id, None] for item in choice.logprobs]
            if self.sampling.top_logprobs:
                meta["output_top_logprobs"] = [
                    [[logprob, token_id, None] for token_id, logprob in item.top] for item in choice.logprobs
                ]
        return {"text": text, "output_ids": output_ids, "meta_info": meta, "index": index}

    async def _deliver(
        self, target: EngineTarget, prompts: list[_Prompt], options: list[ChoiceOptions],
        outputs: AsyncIterator[EngineOutput], writer: ResponseWriter,
    ) -> Delivered:  # fmt: skip
        count = len(prompts) * self.n
        choices = [ChoiceOutput(index, target.tokenizer, options[index // self.n]) for index in range(count)]
        tallies = [UsageTally(len(prompt.ids)) for prompt in prompts]
        writer.usage_so_far = lambda: token_usage(UsageTally.combined(tallies))
        texts = [""] * count
        ids: list[list[int]] = [[] for _ in range(count)]
        finishes: list[Finished | None] = [None] * count
        logprobs = self.sampling.logprobs
        stream = self.request.stream
        if stream:
            await writer.open_stream()
        try:
            async for output in outputs:
                index = output.index
                tally = tallies[index // self.n]
                tally.add(output)
                choice = choices[index]
                events: list[Event] = choice.step(output)
                ids[index].extend(output.token_ids)  # the engine's ids, as SGLang's output_ids
                for event in events:
                    if isinstance(event, (TextDelta, ReasoningDelta)):
                        texts[index] += event.text
                    elif isinstance(event, Finished):
                        finishes[index] = event
                if stream and events:
                    item = self._object(index, texts[index], choice, tally, finishes[index], ids[index], logprobs)
                    await writer.chunk(b"data: " + orjson.dumps(item) + b"\n\n")
                if all(other.done for other in choices):
                    break
        except UpstreamFailure as failure:
            if not stream:
                raise
            await writer.break_stream(errors.stream_failed(failure.detail))
            return Delivered(False, token_usage(UsageTally.combined(tallies)))
        if stream:
            await writer.end_stream()
            return Delivered(True, token_usage(UsageTally.combined(tallies)))
        objects = [
            self._object(i, texts[i], choices[i], tallies[i // self.n], finishes[i], ids[i], logprobs) for i in range(count)
        ]
        for item in objects:
            item.pop("index")
        body = objects if self.batch or self.n > 1 else objects[0]
        await writer.whole(200, b"application/json", orjson.dumps(body))
        return Delivered(True, token_usage(UsageTally.combined(tallies)))

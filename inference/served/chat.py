"""POST /v1/chat/completions on engine workers (spec 1, chat completions on gRPC workers).

Stages: the tool choice and sampling (once per request) → per worker: its tokenizer, the chat
template rendered and tokenized (once per tokenizer), the context check → the engine request →
per choice: detokenize, stop strings, reasoning and tool parsers (:mod:`inference.pipeline.choices`)
→ the events as chat chunks (SSE) or one chat.completion object, with usage from the engine's
counters.

Streams: a first chunk per choice with the assistant role, one chunk per event, a finish chunk per
choice; ``include_usage`` adds a last chunk with no choices and the usage, ``continuous_usage_stats``
a running usage on every chunk. Profile D puts the usage on the last finish chunk instead (and
``usage: null`` on the earlier chunks when include_usage is on). A failure after the stream started
is the in-band error frame, then ``[DONE]``.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator

import orjson

from inference import errors
from inference.pipeline.choices import ChoiceOutput, joined
from inference.pipeline.events import Event, Finished, ReasoningDelta, TextDelta, ToolCallDelta
from inference.accounting import Delivered
from inference.pipeline.usage import UsageTally, token_usage
from inference.routing.workers import WorkerHandle
from inference.schemas.profiles import Profile, detect_profile
from inference.pipeline.target import EngineTarget
from inference.served.base import ServedRequest, ServedSurface, uuid4_hex
from inference.pipeline.turn import chat_turn
from inference.pipeline.chat_turn import ChatTurn, TurnRun, turn_events, turn_step
from inference.pipeline.engine_answer import EngineAnswer
from inference.served.openai_shapes import chat_logprobs, usage_json
from inference.upstreams.engine import EngineOutput
from inference.upstreams.failures import UpstreamFailure
from inference.writers import ResponseWriter

__all__ = ["ServedChat"]

_OPENAI_FINISH = {"abort": "stop"}  # the engine's own abort is not an OpenAI finish reason
_TEXT_TAIL = b'},"logprobs":null,"finish_reason":null}]}\n\n'
_CONTENT_KEY = b',"delta":{"content":'
_ROLE_KEY = b',"delta":{"role":"assistant","content":'


class ServedChat(ServedSurface):
    def __init__(self, request: ServedRequest) -> None:
        super().__init__(request)
        body = request.body
        rid = body.get("rid")
        self.id = rid if isinstance(rid, str) and rid else f"chatcmpl-{uuid4_hex()}"
        self.turn = ChatTurn(request.target_of, chat_turn(body, request.model, stream=request.stream), self.id)
        self.sampling = self.turn.sampling
        self.created = int(time.time())
        self.model = request.model or request.requested_model
        options = body.get("stream_options") or {}
        self.include_usage = options.get("include_usage") is True
        self.continuous_usage = options.get("continuous_usage_stats") is True
        self.usage_on_finish = detect_profile(request.requested_model) is Profile.DEEPSEEK_V4
        self._head: bytes | None = None  # a chunk's bytes up to its choice's index (_text_chunk)

    async def open(self, worker: WorkerHandle) -> EngineAnswer:
        return await self.turn.open(worker, self._stream if self.request.stream else self._whole)

    # --- one chat.completion object ---------------------------------------------------------------

    async def _whole(self, run: TurnRun, outputs: AsyncIterator[EngineOutput], writer: ResponseWriter) -> Delivered:
        target = run.target
        choices = run.choices()
        events: list[list[Event]] = [[] for _ in choices]
        tally = UsageTally(run.prompt_tokens)
        writer.usage_so_far = lambda: token_usage(tally.usage())
        async for choice, added in turn_events(outputs, choices, tally.add):
            events[choice.index].extend(added)
        usage = tally.usage()
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._whole_choice(target, choice, events[choice.index]) for choice in choices],
            "usage": usage_json(usage),
        }
        await writer.whole(200, b"application/json", orjson.dumps(body))
        return Delivered(True, token_usage(usage))

    def _whole_choice(self, target: EngineTarget, choice: ChoiceOutput, events: list[Event]) -> dict[str, Any]:
        content, reasoning, deltas = joined(events)
        finished = next((event for event in events if isinstance(event, Finished)), None)
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if reasoning:
            message["reasoning_content"] = reasoning
        calls: dict[int, dict[str, Any]] = {}
        for delta in deltas:
            if delta.name is not None:
                calls[delta.index] = {"id": delta.id, "type": "function", "function": {"name": delta.name, "arguments": ""}}
            elif delta.index in calls:
                calls[delta.index]["function"]["arguments"] += delta.arguments_delta
        if calls:
            message["tool_calls"] = [calls[index] for index in sorted(calls)]
            if not content:
                message["content"] = None
        reason = finished.reason if finished is not None else "stop"
        return {
            "index": choice.index,
            "message": message,
            "logprobs": chat_logprobs(target.tokenizer, choice.logprobs) if self.sampling.logprobs else None,
            "finish_reason": _OPENAI_FINISH.get(reason, reason),
            "matched_stop": finished.matched_stop if finished is not None else None,
        }

    # --- a stream of chat.completion.chunk ----------------------------------------------------------

    def _chunk(self, choices: list[dict[str, Any]], usage: Any = None, *, with_usage: bool = False) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if with_usage:
            chunk["usage"] = usage
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    async def _stream(self, run: TurnRun, outputs: AsyncIterator[EngineOutput], writer: ResponseWriter) -> Delivered:
        target = run.target
        choices = run.choices()
        logprobs_sent = [0] * len(choices)
        tally = UsageTally(run.prompt_tokens)
        writer.usage_so_far = lambda: token_usage(tally.usage())
        await writer.open_stream()
        out = bytearray()
        running = self.continuous_usage
        for choice in choices:  # the role chunk, from the per-stream bytes when no usage goes in it
            if running or self.usage_on_finish:
                out += self._event_chunk(choice.index, {"role": "assistant", "content": ""}, tally, running)
            else:
                out += self._text_chunk(choice.index, _ROLE_KEY, "")
        await writer.chunk(bytes(out))
        with_logprobs = self.sampling.logprobs
        # A content delta's chunk straight from the per-stream bytes when _event_bytes would write it so.
        plain = not with_logprobs and not running and not self.usage_on_finish
        text_chunk = self._text_chunk
        count = tally.add
        # Per choice, a content chunk's bytes up to its text (the text and _TEXT_TAIL follow).
        heads = [b"%s%d%s" % (self._chunk_head(), choice.index, _CONTENT_KEY) for choice in choices]
        send_event = writer.event
        dumps = orjson.dumps
        final = b""  # the last step's bytes, when it ended every choice (sent with the stream's end)
        try:
            async for output in outputs:  # turn_events written out: one generator less per token
                if plain:  # the usual token: its content text straight to its chunk (turn_step's work)
                    choice = choices[output.index]
                    text = choice.text_step(output)
                    if text is not None:
                        count(output, choice.reasoning_tokens)
                        if text:
                            await send_event(b"".join((heads[output.index], dumps(text), _TEXT_TAIL)))
                        continue
                choice, added = turn_step(output, choices, count)
                if not with_logprobs and len(added) == 1:
                    event = added[0]
                    if plain and type(event) is TextDelta:
                        await writer.chunk(text_chunk(choice.index, _CONTENT_KEY, event.text))
                        continue  # one content delta: the usual step
                    if type(event) is not Finished:
                        await writer.chunk(self._event_bytes(choice.index, event, tally, None, False))
                        continue  # one delta: written as the loop below writes it
                out.clear()
                logprobs = None
                for event in added:
                    if with_logprobs and len(choice.logprobs) > logprobs_sent[choice.index]:
                        logprobs = chat_logprobs(target.tokenizer, choice.logprobs[logprobs_sent[choice.index] :])
                        logprobs_sent[choice.index] = len(choice.logprobs)
                    last = isinstance(event, Finished) and all(other.done for other in choices)
                    out += self._event_bytes(choice.index, event, tally, logprobs, last)
                    logprobs = None
                # Only a step that ended its choice can end all (its events close with Finished: not
                # one of the single deltas above). Its bytes go out with the usage chunk and the
                # closing event: one body message for the stream's end (the same bytes).
                if choice.done and all(other.done for other in choices):
                    final = bytes(out)
                    break
                if out:
                    await writer.chunk(bytes(out))
        except UpstreamFailure as failure:
            await writer.break_stream(errors.stream_failed(failure.detail))
            return Delivered(False, token_usage(tally.usage()))
        usage = tally.usage()
        if self.include_usage and not self.usage_on_finish:
            final += self._chunk([], usage_json(usage), with_usage=True)
        if final:
            await writer.chunk(final, last=True)
        else:
            await writer.end_stream()
        return Delivered(True, token_usage(usage))

    def _event_chunk(
        self, index: int, delta: dict[str, Any], tally: UsageTally, running: bool,
        finish_reason: str | None = None, matched_stop: Any = None, logprobs: Any = None, last: bool = False,
    ) -> bytes:  # fmt: skip
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["matched_stop"] = matched_stop
        if self.usage_on_finish:
            if last:
                return self._chunk([choice], usage_json(tally.usage()), with_usage=True)
            return self._chunk([choice], None, with_usage=self.include_usage or running)
        if running:
            return self._chunk([choice], usage_json(tally.usage()), with_usage=True)
        return self._chunk([choice])

    def _text_chunk(self, index: int, key: bytes, text: str) -> bytes:
        """A content or reasoning delta's chunk, as :meth:`_event_chunk` writes it with no logprobs and
        no usage, from bytes made once per stream: the chunk a stream sends per token."""
        return b"".join((self._head or self._chunk_head(), b"%d" % index, key, orjson.dumps(text), _TEXT_TAIL))

    def _chunk_head(self) -> bytes:
        """A chunk's bytes up to its choice's index, made once per stream."""
        head = self._head
        if head is None:
            head = self._head = b"".join((
                b'data: {"id":', orjson.dumps(self.id), b',"object":"chat.completion.chunk","created":',
                orjson.dumps(self.created), b',"model":', orjson.dumps(self.model), b',"choices":[{"index":',
            ))  # fmt: skip
        return head

    def _event_bytes(self, index: int, event: Event, tally: UsageTally, logprobs: Any, last: bool) -> bytes:
        running = self.continuous_usage
        if logprobs is None and not running and not self.usage_on_finish:
            kind = type(event)
            if kind is TextDelta:
                return self._text_chunk(index, _CONTENT_KEY, event.text)  # type: ignore[union-attr]
            if kind is ReasoningDelta:
                return self._text_chunk(index, b',"delta":{"reasoning_content":', event.text)  # type: ignore[union-attr]
        if isinstance(event, TextDelta):
            return self._event_chunk(index, {"content": event.text}, tally, running, logprobs=logprobs)
        if isinstance(event, ReasoningDelta):
            return self._event_chunk(index, {"reasoning_content": event.text}, tally, running, logprobs=logprobs)
        if isinstance(event, ToolCallDelta):
            call: dict[str, Any] = {"index": event.index}
            if event.name is not None:
                call.update(id=event.id, type="function", function={"name": event.name, "arguments": event.arguments_delta})
            else:
                call["function"] = {"arguments": event.arguments_delta}
            return self._event_chunk(index, {"tool_calls": [call]}, tally, running, logprobs=logprobs)
        reason = _OPENAI_FINISH.get(event.reason, event.reason)
        return self._event_chunk(
            index, {}, tally, running, finish_reason=reason, matched_stop=event.matched_stop, logprobs=logprobs, last=last
        )

"""POST /v1/messages on engine workers: the gateway is the Anthropic Messages server (spec 1,
"Messages-style API": gRPC and ZMQ handling, Response building; "Events": Messages stream).

The request is mapped once to a :class:`~inference.pipeline.turn.Turn` (:mod:`.messages_turn`) and
run by :class:`~inference.pipeline.chat_turn.ChatTurn` as chat completions are; its pipeline events
become the Messages answer:

- whole: a thinking block first (empty signature), then the text, then tool_use blocks (a parser's
  ``call_<suffix>`` id becomes ``toolu_<suffix>``; other ids unchanged); stop_reason tool_use when a
  call was made, stop_sequence (with the match) when a stop sequence ended it, max_tokens at the
  token limit, end_turn otherwise; usage with the cache counters 0;
- streamed: message_start (zero counters), each block's content_block_start, its deltas
  (thinking_delta, text_delta, input_json_delta) and content_block_stop, then message_delta (stop
  reason and the final usage) and message_stop; no ping. A failure after the stream started is the
  ``error`` event (the surface's framing).

MLX's service takes no stop strings, no constraint and no images: a request with stop_sequences, a
forced tool (any or tool) or an image is refused there with 400, before dispatch.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator

import orjson

from inference import errors
from inference.pipeline.choices import joined
from inference.pipeline.events import Event, Finished, ReasoningDelta, TextDelta, ToolCallDelta
from inference.accounting import Delivered
from inference.pipeline.usage import UsageTally, token_usage
from inference.routing.workers import RuntimeType, WorkerHandle
from inference.schemas.messages import MessagesRequest
from inference.served.base import ServedRequest, ServedSurface
from inference.pipeline.chat_turn import ChatTurn, TurnRun, turn_events
from inference.pipeline.engine_answer import EngineAnswer
from inference.served.messages_turn import has_images, messages_turn
from inference.upstreams.engine import EngineOutput, FinishReason
from inference.upstreams.failures import UpstreamFailure
from inference.writers import ResponseWriter

__all__ = ["ServedMessages", "stop_reason", "tool_use_id"]

_CALL_PREFIX = "call_"


def tool_use_id(call_id: str | None) -> str:
    """A parser's ``call_<suffix>`` as ``toolu_<suffix>``; model-specific formats unchanged."""
    if call_id is None:
        return "toolu_" + uuid.uuid4().hex[:24]
    return "toolu_" + call_id[len(_CALL_PREFIX) :] if call_id.startswith(_CALL_PREFIX) else call_id


def stop_reason(finished: Finished | None, calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) by the spec's rules, in their order."""
    if calls:
        return "tool_use", None
    if finished is not None and isinstance(finished.matched_stop, str):
        return "stop_sequence", finished.matched_stop
    if finished is not None and finished.reason == FinishReason.LENGTH.value:
        return "max_tokens", None
    return "end_turn", None


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
    }  # fmt: skip


def _input(arguments: str) -> Any:
    """A call's arguments (JSON text) as the tool_use block's input object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _event(name: bytes, payload: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class _Blocks:
    """The content blocks of a streamed message as the events open, extend and close them."""

    __slots__ = ("out", "index", "kind", "calls")

    def __init__(self) -> None:
        self.out = bytearray()
        self.index = -1
        self.kind: str | None = None  # the open block's type
        self.calls = 0

    def _open(self, block: dict[str, Any]) -> None:
        self.close()
        self.index += 1
        self.kind = block["type"]
        self.out += _event(b"content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})

    def close(self) -> None:
        if self.kind is not None:
            self.out += _event(b"content_block_stop", {"type": "content_block_stop", "index": self.index})
            self.kind = None

    def _delta(self, delta: dict[str, Any]) -> None:
        self.out += _event(b"content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def add(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            if event.text:
                if self.kind != "text":
                    self._open({"type": "text", "text": ""})
                self._delta({"type": "text_delta", "text": event.text})
        elif isinstance(event, ReasoningDelta):
            if event.text:
                if self.kind != "thinking":
                    self._open({"type": "thinking", "thinking": "", "signature": ""})
                self._delta({"type": "thinking_delta", "thinking": event.text})
        elif isinstance(event, ToolCallDelta):
            if event.name is not None:
                self.calls += 1
                self._open({"type": "tool_use", "id": tool_use_id(event.id), "name": event.name, "input": {}})
            if event.arguments_delta and self.kind == "tool_use":
                self._delta({"type": "input_json_delta", "partial_json": event.arguments_delta})


class ServedMessages(ServedSurface):
    def __init__(self, request: ServedRequest) -> None:
        super().__init__(request)
        parsed: MessagesRequest = request.parsed
        self.parsed = parsed
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        rid = request.body.get("rid")
        engine_id = rid if isinstance(rid, str) and rid else self.id
        self.turn = ChatTurn(request.target_of, messages_turn(parsed, request.model, stream=request.stream), engine_id)
        self.model = request.model or request.requested_model

    def _refuse_on_mlx(self) -> None:
        """MLX's service has no stop strings, constraint or images (spec 1: 400)."""
        parsed = self.parsed
        if parsed.stop_sequences:
            raise errors.invalid_request("stop_sequences are not supported by this worker's runtime (mlx)", "stop_sequences")
        if parsed.tool_choice is not None and parsed.tool_choice.kind in ("any", "tool"):
            raise errors.invalid_request(
                f"tool_choice {parsed.tool_choice.kind} is not supported by this worker's runtime (mlx)", "tool_choice"
            )
        if has_images(parsed):
            raise errors.invalid_request("image blocks are not supported by this worker's runtime (mlx)", "messages")

    async def open(self, worker: WorkerHandle) -> EngineAnswer:
        if worker.record.runtime_type == RuntimeType.MLX:
            self._refuse_on_mlx()
        return await self.turn.open(worker, self._stream if self.request.stream else self._whole)

    def _message(self, content: list[dict[str, Any]], reason: str | None, sequence: str | None, usage: dict[str, int]) -> dict[str, Any]:
        return {
            "id": self.id, "type": "message", "role": "assistant", "content": content, "model": self.model,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage,
        }  # fmt: skip

    # --- one message object -------------------------------------------------------------------------

    async def _whole(self, run: TurnRun, outputs: AsyncIterator[EngineOutput], writer: ResponseWriter) -> Delivered:
        (choice,) = run.choices()
        events: list[Event] = []
        tally = UsageTally(run.prompt_tokens)
        writer.usage_so_far = lambda: token_usage(tally.usage())
        async for _, added in turn_events(outputs, [choice], tally.add):
            events.extend(added)
        text, thinking, deltas = joined(events)
        finished = next((event for event in events if isinstance(event, Finished)), None)
        calls: dict[int, dict[str, Any]] = {}
        arguments: dict[int, list[str]] = {}
        for delta in deltas:
            if delta.name is not None:
                calls[delta.index] = {"type": "tool_use", "id": tool_use_id(delta.id), "name": delta.name}
                arguments[delta.index] = []
            if delta.index in arguments:
                arguments[delta.index].append(delta.arguments_delta)
        content: list[dict[str, Any]] = []
        if thinking:
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        if text:
            content.append({"type": "text", "text": text})
        for index in sorted(calls):
            content.append({**calls[index], "input": _input("".join(arguments[index]))})
        reason, sequence = stop_reason(finished, bool(calls))
        usage = tally.usage()
        body = self._message(content, reason, sequence, _usage(usage.prompt_tokens, usage.completion_tokens))
        await writer.whole(200, b"application/json", orjson.dumps(body))
        return Delivered(True, token_usage(usage))

    # --- the event stream ---------------------------------------------------------------------------

    async def _stream(self, run: TurnRun, outputs: AsyncIterator[EngineOutput], writer: ResponseWriter) -> Delivered:
        (choice,) = run.choices()
        tally = UsageTally(run.prompt_tokens)
        writer.usage_so_far = lambda: token_usage(tally.usage())
        await writer.open_stream()
        start = {"type": "message_start", "message": self._message([], None, None, _usage(0, 0))}
        await writer.chunk(_event(b"message_start", start))
        blocks = _Blocks()
        finished: Finished | None = None
        try:
            async for _, added in turn_events(outputs, [choice], tally.add):
                for event in added:
                    if isinstance(event, Finished):
                        finished = event
                    else:
                        blocks.add(event)
                if blocks.out:
                    await writer.chunk(bytes(blocks.out))
                    blocks.out.clear()
        except UpstreamFailure as failure:
            await writer.break_stream(errors.stream_failed(failure.detail))
            return Delivered(False, token_usage(tally.usage()))
        blocks.close()
        reason, sequence = stop_reason(finished, blocks.calls > 0)
        usage = tally.usage()
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": _usage(usage.prompt_tokens, usage.completion_tokens),
        }
        blocks.out += _event(b"message_delta", delta) + _event(b"message_stop", {"type": "message_stop"})
        await writer.chunk(bytes(blocks.out))
        await writer.end_stream()
        return Delivered(True, token_usage(usage))

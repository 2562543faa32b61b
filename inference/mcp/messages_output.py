"""What the Messages API's MCP tool loop (:mod:`inference.mcp.messages_loop`) answers, and how it reads
a provider's streamed turn (spec 1, "Messages-style API": Response; "Events").

- :class:`LoopOutput`: the one message the loop answers, whole (content and usage summed over the
  turns, written at the end) or streamed (message_start with zero counters when the stream opens,
  then each block's start, delta and stop events under the loop's own block indexes, and one
  message_delta with the summed usage and one message_stop at the end).
- :class:`StreamedTurn`: one turn the provider streams, its events relayed to the client as they
  arrive (block indexes renumbered; pings kept; the turn's own message_start, message_delta and
  message_stop held back), except the tool_use blocks that call MCP tools, which are held until the
  loop has run them; the turn is also read into a whole message (blocks accumulated from their deltas)
  for the next turn's history, checked as a provider's whole answer is (502 ``parse_error``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping

import orjson

from inference import errors
from inference.schemas.message_answer import parse_message
from inference.upstreams import RelayAnswer
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.sse import sse_events
from inference.writers import ResponseWriter

__all__ = ["COUNTERS", "LoopOutput", "StreamedTurn", "Turn"]

COUNTERS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_TOOL_LIKE = ("tool_use", "mcp_tool_use", "server_tool_use")


def _event(kind: str, fields: Mapping[str, Any]) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))


def _block_events(index: int, block: Mapping[str, Any]) -> bytes:
    """One whole block as its start, delta and stop events."""
    kind = block.get("type")
    if kind == "text":
        start: Mapping[str, Any] = {**block, "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
    elif kind == "thinking":
        start = {**block, "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]  # fmt: skip
    elif kind in _TOOL_LIKE:
        start = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block.get("input") or {}).decode()}]
    else:
        start, deltas = block, []
    out = bytearray(_event("content_block_start", {"index": index, "content_block": start}))
    for delta in deltas:
        out += _event("content_block_delta", {"index": index, "delta": delta})
    out += _event("content_block_stop", {"index": index})
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Turn:
    """One model turn read whole: the provider's message, and the positions of its content blocks
    already relayed to the client (a streamed turn's; none for a whole one)."""

    message: dict[str, Any]
    relayed: frozenset[int] = frozenset()


class LoopOutput:
    """The loop's one message (see the module's docstring)."""

    def __init__(self, writer: ResponseWriter, message_id: str, model: str, stream: bool) -> None:
        self.writer = writer
        self.id = message_id
        self.model = model
        self.stream = stream
        self.content: list[dict[str, Any]] = []  # a whole answer's blocks
        self.indexes = 0  # the client's block indexes used so far
        self.usage = dict.fromkeys(COUNTERS, 0)

    def _shell(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": None, "stop_sequence": None}  # fmt: skip

    async def open(self) -> None:
        await self.writer.open_stream()
        message = {**self._shell(), "usage": dict.fromkeys(COUNTERS, 0)}
        await self.writer.chunk(_event("message_start", {"message": message}))

    def count(self, usage: Mapping[str, Any]) -> None:
        for name in COUNTERS:
            value = usage.get(name)
            self.usage[name] += value if isinstance(value, int) else 0

    def claim(self) -> int:
        """The client's index for the next block."""
        self.indexes += 1
        return self.indexes - 1

    async def relay(self, event: Mapping[str, Any]) -> None:
        await self.writer.chunk(_event(str(event["type"]), event))

    async def blocks(self, blocks: list[dict[str, Any]]) -> None:
        if not self.stream:
            self.content.extend(blocks)
        elif blocks:
            await self.writer.chunk(b"".join(_block_events(self.claim(), block) for block in blocks))

    async def finish(self, last: Mapping[str, Any]) -> None:
        stop = {"stop_reason": last.get("stop_reason"), "stop_sequence": last.get("stop_sequence")}
        if not self.stream:
            whole = {**self._shell(), **stop, "content": self.content, "usage": self.usage}
            await self.writer.whole(200, b"application/json", orjson.dumps(whole))
            return
        await self.writer.chunk(_event("message_delta", {"delta": stop, "usage": self.usage}))
        await self.writer.chunk(_event("message_stop", {}), last=True)


def _index(event: Mapping[str, Any], known: Collection[int] | None = None) -> int:
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or (known is not None and index not in known):
        raise errors.parse_error(f"a {event.get('type')} event without a block index it opened")
    return index


class StreamedTurn:
    """One streamed turn (see the module's docstring); ``held`` names the MCP tools whose calls are
    held back."""

    def __init__(self, out: LoopOutput, held: Collection[str]) -> None:
        self.out = out
        self.held = held
        self.blocks: dict[int, dict[str, Any]] = {}  # by the provider's index
        self.json: dict[int, str] = {}  # a tool-like block's input as its deltas gave it
        self.to_client: dict[int, int] = {}  # the provider's index → the client's, for relayed blocks
        self.message: dict[str, Any] = {}
        self.usage: dict[str, Any] = {}
        self.stop: dict[str, Any] = {}

    async def read(self, answer: RelayAnswer, limit: int) -> Turn:
        """Relay the turn and read it whole. Raises UpstreamFailure when the stream breaks off, and
        GatewayError for an error event or a turn that does not parse."""
        async for event in sse_events(answer.chunks(), limit):
            if await self._step(event):
                order = sorted(self.blocks)
                whole = {**self.message, "type": "message", "role": "assistant", "content": [self.blocks[i] for i in order],
                         "stop_reason": None, "stop_sequence": None, **self.stop, "usage": self.usage}  # fmt: skip
                message = parse_message(orjson.dumps(whole))
                return Turn(message, frozenset(p for p, i in enumerate(order) if i in self.to_client))
        raise UpstreamFailure(FailureKind.BROKEN, "the provider's stream ended before message_stop")

    async def _step(self, event: dict[str, Any]) -> bool:
        """One provider event; True at the turn's end."""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            message = message if isinstance(message, dict) else {}
            self.message = {"id": message.get("id"), "model": message.get("model")}
            self.usage = dict(message.get("usage") or {})
        elif kind == "content_block_start":
            index = _index(event)
            block = event.get("content_block")
            if not isinstance(block, dict):
                raise errors.parse_error("a content_block_start event without its block")
            self.blocks[index] = dict(block)
            if block.get("type") == "tool_use" and block.get("name") in self.held:
                return False  # run by the loop first
            self.to_client[index] = self.out.claim()
            await self.out.relay({**event, "index": self.to_client[index]})
        elif kind == "content_block_delta":
            index = _index(event, self.blocks)
            delta = event.get("delta")
            self._accumulate(index, delta if isinstance(delta, dict) else {})
            if index in self.to_client:
                await self.out.relay({**event, "index": self.to_client[index]})
        elif kind == "content_block_stop":
            index = _index(event, self.blocks)
            if index in self.json:
                try:
                    self.blocks[index]["input"] = orjson.loads(self.json[index] or "{}")
                except orjson.JSONDecodeError:
                    raise errors.parse_error(f"content[{index}].input is not JSON") from None
            if index in self.to_client:
                await self.out.relay({**event, "index": self.to_client[index]})
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                self.stop = {key: delta[key] for key in ("stop_reason", "stop_sequence") if key in delta}
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.usage.update((name, value) for name, value in usage.items() if value is not None)
        elif kind == "message_stop":
            return True
        elif kind == "error":
            error = event.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            raise errors.upstream_unavailable(f"the provider's stream failed: {message or 'an error event'}")
        elif kind == "ping":
            await self.out.relay(event)
        return False

    def _accumulate(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self.blocks[index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = str(delta.get("signature") or "")
        elif kind == "input_json_delta":
            self.json[index] = self.json.get(index, "") + str(delta.get("partial_json") or "")
        elif kind == "citations_delta" and "citation" in delta:
            block.setdefault("citations", []).append(delta["citation"])

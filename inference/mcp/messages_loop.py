"""POST /v1/messages with ``X-GW-MCP: enabled`` and an ``mcp_toolset`` on the Anthropic provider: the
MCP tool loop run by the gateway (spec 1, "Messages-style API": MCP tool loop; "Events"; "Errors";
"Limits"). Without that header (or without a toolset) the request is relayed as it came.

- The request's MCP servers are connected (:mod:`inference.mcp.toolsets`; none connects: 502
  ``mcp_connection_failed``); ``mcp_servers`` and the ``mcp_toolset`` entries are replaced by the
  enabled MCP tools as custom tools, tool_choice auto when the client gave none.
- Each model turn is a whole (non-streamed) request to the provider's /v1/messages, with the client's
  credential and version headers as the relay sends them (never X-GW-MCP) and the worker's own key.
  The first turn is the route's attempt; every later one runs through :func:`~inference.kit.run_turn`
  on the same worker. The tools a turn calls (tool_use blocks naming MCP tools) are run, their
  results sent back as tool_result blocks, and the next turn asked, for at most :data:`MAX_ROUNDS`
  rounds: a model still calling MCP tools after the last one fails the request (502
  ``mcp_max_iterations``). A turn that also calls one of the client's own tools ends the loop (those
  calls go back to the client).
- The answer is one message: each turn's blocks in order, every MCP call an ``mcp_tool_use`` block
  (id ``mcptoolu_...``, name, server_name, input) followed by its ``mcp_tool_result`` (tool_use_id,
  content, is_error), then the final turn's content; the last turn's stop_reason; usage summed over
  the turns.
- Streamed, the events are opened before the first model call (so any failure, even the first
  turn's, arrives as an ``error`` event): message_start with zero counters, each turn's blocks as
  they are known (a turn's blocks once the turn and its tool calls are done), and one message_delta
  and one message_stop at the end. A provider's error status on a later turn (or on the first turn
  of a stream) is reported with its status and message; a whole answer's first turn's error is the
  provider's answer itself, status and body unchanged.
"""

from __future__ import annotations

import os
from typing import Any, Awaitable, Callable, Mapping

import orjson

from inference import errors
from inference.errors import GatewayError
from inference.kit import run_turn
from inference.mcp.client import McpToolResult
from inference.mcp.toolsets import McpToolsets
from inference.routing.workers import WorkerHandle
from inference.schemas.base import ValidatedRequest
from inference.schemas.message_answer import parse_message
from inference.schemas.messages import MessagesRequest
from inference.served.base import ServedAnswer, ServedRequest, ServedSurface
from inference.upstreams import RelayAnswer, RelayRequest
from inference.upstreams.checked import read_whole
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.provider import EXTERNAL
from inference.writers import ResponseWriter

__all__ = ["MAX_ROUNDS", "MCP_HEADER", "MessagesMcpLoop", "runs_mcp_loop"]

PATH = "/v1/messages"
MAX_ROUNDS = 10
"""Rounds of MCP tool calls one request may run (spec 1, Limits: tool-loop rounds at most 10)."""

MCP_HEADER = b"x-gw-mcp"
_COUNTERS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def runs_mcp_loop(request: ValidatedRequest, header: Callable[[bytes], bytes | None]) -> bool:
    """Whether the gateway runs the tool loop for a validated Messages request: the client sent
    ``X-GW-MCP: enabled`` and its tools hold an mcp_toolset entry."""
    parsed = request.parsed
    value = header(MCP_HEADER)
    return isinstance(parsed, MessagesRequest) and parsed.has_mcp_toolset and value is not None and (
        value.strip().lower() == b"enabled"
    )


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
    elif kind in ("tool_use", "mcp_tool_use", "server_tool_use"):
        start = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block.get("input") or {}).decode()}]
    else:
        start, deltas = block, []
    out = bytearray(_event("content_block_start", {"index": index, "content_block": start}))
    for delta in deltas:
        out += _event("content_block_delta", {"index": index, "delta": delta})
    out += _event("content_block_stop", {"index": index})
    return bytes(out)


def _upstream_error(status: int, body: bytes) -> GatewayError:
    """A provider's refusal of a streamed turn, for the error event: its status and message kept."""
    try:
        message = orjson.loads(body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace")
    return errors.upstream_unavailable(f"the provider answered HTTP {status}: {message}")


class MessagesMcpLoop(ServedSurface):
    """The tool loop of one request (see the module's docstring)."""

    def __init__(self, request: ServedRequest) -> None:
        super().__init__(request)
        self.toolsets = McpToolsets.of_request(request.body)  # 400 for a malformed server or toolset
        self.id = "msg_" + os.urandom(12).hex()
        self._connected = False

    # --- the turns ------------------------------------------------------------------------------------
    def _payload(self, messages: list[Any]) -> bytes:
        body = self.request.body
        sent = {key: value for key, value in body.items() if key not in ("mcp_servers", "stream", "tools", "messages")}
        sent["model"] = self.request.model or body["model"]
        sent["messages"] = messages
        sent["tools"] = [
            *(tool for tool in body.get("tools") or () if tool.get("type") != "mcp_toolset"), *self.toolsets.custom_tools()
        ]  # fmt: skip
        if body.get("tool_choice") is None:
            sent["tool_choice"] = {"type": "auto"}
        return orjson.dumps(sent)

    def _open_turn(self, worker: WorkerHandle, messages: list[Any]) -> Awaitable[RelayAnswer]:
        request = self.request
        return request.dp.relay_for(EXTERNAL, PATH).open(RelayRequest(
            worker, PATH, self._payload(messages), False, request.writer.request_id, request.headers,
            request.identity, request.caller_key,
        ))  # fmt: skip

    async def _connect(self) -> None:
        if not self._connected:
            await self.toolsets.connect()
            self._connected = True

    async def open(self, worker: WorkerHandle) -> ServedAnswer:
        if self.request.stream:
            return _LoopAnswer(self, worker, None)  # the stream opens before anything is asked
        await self._connect()
        first = await self._open_turn(worker, list(self.request.body["messages"]))
        if first.status != 200:
            return first  # the provider's own answer, status and body unchanged (or retried)
        return _LoopAnswer(self, worker, first)

    async def _later_turn(
        self, worker: WorkerHandle, messages: list[Any], writer: ResponseWriter
    ) -> dict[str, Any] | None:
        """A turn after the first, through the attempts loop pinned to ``worker``. None when the
        provider refused it and its answer went to the client as it is (a whole answer); in a stream
        the refusal is raised, for the error event."""
        found: list[dict[str, Any]] = []
        limit = self.request.dp.config.max_buffered_response_bytes

        async def deliver(answer: RelayAnswer) -> bool:
            if answer.status != 200:
                if not self.request.stream:
                    return await answer.forward(writer)
                raise _upstream_error(answer.status, await read_whole(answer, limit))
            found.append(parse_message(await read_whole(answer, limit)))
            return True

        await run_turn(self.request.dp, worker, PATH, writer.clock, lambda at: self._open_turn(at, messages), deliver)
        return found[0] if found else None

    # --- the loop -------------------------------------------------------------------------------------
    async def run(self, worker: WorkerHandle, first: RelayAnswer | None, writer: ResponseWriter) -> bool:
        """The loop, answered through ``writer``; False when the worker failed the first turn."""
        out = _Output(self, writer)
        limit = self.request.dp.config.max_buffered_response_bytes
        if self.request.stream:
            await out.open()
            try:
                await self._connect()
                first = await self._open_turn(worker, list(self.request.body["messages"]))
            except UpstreamFailure as failure:
                await writer.error(failure.to_error())
                return False
            except GatewayError as error:
                await writer.error(error)
                return True
        assert first is not None
        try:
            body = await read_whole(first, limit)
        except UpstreamFailure as failure:
            if not self.request.stream:
                raise
            await writer.error(failure.to_error())
            return False
        try:
            if first.status != 200:  # a stream's first turn refused by the provider
                raise _upstream_error(first.status, body)
            await self._rounds(worker, parse_message(body), out, writer)
        except GatewayError as error:
            if not self.request.stream:
                raise
            await writer.error(error)
        return True

    async def _rounds(self, worker: WorkerHandle, message: dict[str, Any], out: _Output, writer: ResponseWriter) -> None:
        messages = list(self.request.body["messages"])
        exposed = self.toolsets.exposed
        rounds = 0
        while True:
            out.count(message.get("usage") or {})
            content = message["content"]
            uses = [b for b in content if b["type"] == "tool_use" and b["name"] in exposed]
            own = any(b["type"] == "tool_use" and b["name"] not in exposed for b in content)
            if not uses or message.get("stop_reason") != "tool_use":
                await out.blocks(content)
                return await out.finish(message)
            if rounds == MAX_ROUNDS:
                raise errors.mcp_max_iterations(MAX_ROUNDS)
            rounds += 1
            results = await self.toolsets.run([(b["name"], b.get("input") or {}) for b in uses])
            by_id = {b["id"]: result for b, result in zip(uses, results)}
            shown: list[dict[str, Any]] = []
            for block in content:
                result = by_id.get(block.get("id")) if block["type"] == "tool_use" else None
                shown.extend(_mcp_blocks(block, exposed[block["name"]].server, result) if result else (block,))
            await out.blocks(shown)
            if own:
                return await out.finish(message)
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": [_tool_result(b["id"], by_id[b["id"]]) for b in uses]})
            following = await self._later_turn(worker, messages, writer)
            if following is None:
                return None  # the provider's refusal was the answer
            message = following


def _mcp_blocks(use: Mapping[str, Any], server: str, result: McpToolResult) -> tuple[dict[str, Any], dict[str, Any]]:
    call_id = "mcptoolu_" + str(use["id"]).removeprefix("toolu_")
    return (
        {"type": "mcp_tool_use", "id": call_id, "name": use["name"], "server_name": server, "input": use.get("input") or {}},
        {"type": "mcp_tool_result", "tool_use_id": call_id, "content": [{"type": "text", "text": result.output}],
         "is_error": result.is_error},
    )  # fmt: skip


def _tool_result(tool_use_id: str, result: McpToolResult) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": result.output, "is_error": result.is_error}


class _Output:
    """The answer being built: the whole message's content and usage, or the client's stream."""

    def __init__(self, loop: MessagesMcpLoop, writer: ResponseWriter) -> None:
        self.loop = loop
        self.writer = writer
        self.stream = loop.request.stream
        self.content: list[dict[str, Any]] = []
        self.usage = dict.fromkeys(_COUNTERS, 0)

    def _shell(self) -> dict[str, Any]:
        return {"id": self.loop.id, "type": "message", "role": "assistant", "model": self.loop.request.model,
                "content": [], "stop_reason": None, "stop_sequence": None}  # fmt: skip

    async def open(self) -> None:
        await self.writer.open_stream()
        message = {**self._shell(), "usage": dict.fromkeys(_COUNTERS, 0)}
        await self.writer.chunk(_event("message_start", {"message": message}))

    def count(self, usage: Mapping[str, Any]) -> None:
        for name in _COUNTERS:
            self.usage[name] += usage.get(name) or 0

    async def blocks(self, blocks: list[dict[str, Any]]) -> None:
        start = len(self.content)
        self.content.extend(blocks)
        if self.stream and blocks:
            await self.writer.chunk(b"".join(_block_events(start + i, block) for i, block in enumerate(blocks)))

    async def finish(self, last: Mapping[str, Any]) -> None:
        stop = {"stop_reason": last.get("stop_reason"), "stop_sequence": last.get("stop_sequence")}
        if not self.stream:
            whole = {**self._shell(), **stop, "content": self.content, "usage": self.usage}
            await self.writer.whole(200, b"application/json", orjson.dumps(whole))
            return
        await self.writer.chunk(_event("message_delta", {"delta": stop, "usage": self.usage}))
        await self.writer.chunk(_event("message_stop", {}), last=True)


class _LoopAnswer:
    """The route's answer: the loop runs when it is forwarded."""

    __slots__ = ("status", "_loop", "_worker", "_first")

    def __init__(self, loop: MessagesMcpLoop, worker: WorkerHandle, first: RelayAnswer | None) -> None:
        self.status = 200
        self._loop = loop
        self._worker = worker
        self._first = first

    async def forward(self, writer: ResponseWriter) -> bool:
        return await self._loop.run(self._worker, self._first, writer)

    async def discard(self) -> None:
        if self._first is not None:
            await self._first.discard()

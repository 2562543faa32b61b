"""POST /v1/messages with ``X-GW-MCP: enabled`` and an ``mcp_toolset`` on the Anthropic provider: the
MCP tool loop run by the gateway (spec 1, "Messages-style API": MCP tool loop; "Events"; "Errors";
"Limits"). Without that header (or without a toolset) the request is relayed as it came.

- The request's MCP servers are connected (:mod:`inference.mcp.toolsets`; none connects: 502
  ``mcp_connection_failed``); ``mcp_servers`` and the ``mcp_toolset`` entries are replaced by the
  enabled MCP tools as custom tools, tool_choice auto when the client gave none.
- Each model turn is a request to the provider's /v1/messages (streamed when the client streams,
  else whole), with the client's credential and version headers as the relay sends them (never
  X-GW-MCP) and the worker's own key. The first turn is the route's attempt; every later one runs
  through :func:`~inference.kit.run_turn` on the same worker. The tools a turn calls (tool_use blocks
  naming MCP tools) are run, their results sent back as tool_result blocks, and the next turn asked,
  for at most :data:`MAX_ROUNDS` rounds: a model still calling MCP tools after the last one fails the
  request (502 ``mcp_max_iterations``). A turn that also calls one of the client's own tools ends the
  loop (those calls go back to the client).
- The answer is one message (:mod:`inference.mcp.messages_output`): each turn's blocks in order,
  every MCP call an ``mcp_tool_use`` block (id ``mcptoolu_...``, name, server_name, input) followed by
  its ``mcp_tool_result`` (tool_use_id, content, is_error), then the final turn's content; the last
  turn's stop_reason; usage summed over the turns.
- Streamed, the events are opened before the first model call (so any failure, even the first
  turn's, arrives as an ``error`` event): message_start with zero counters, each turn's blocks relayed
  as the provider streams them (its MCP calls shown with their results once run), and one
  message_delta and one message_stop at the end. A provider's error status on a later turn (or on
  the first turn of a stream) is reported with its status and message; a whole answer's first turn's
  error is the provider's answer itself, status and body unchanged, as is a later turn's.
"""

from __future__ import annotations

import os
from typing import Any, Awaitable, Callable, Mapping

import orjson

from inference import errors
from inference.accounting import CLEAN, Delivered, TokenUsage
from inference.errors import GatewayError
from inference.kit import run_turn
from inference.mcp.client import McpToolResult
from inference.mcp.messages_output import LoopOutput, StreamedTurn, Turn
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


def runs_mcp_loop(request: ValidatedRequest, header: Callable[[bytes], bytes | None]) -> bool:
    """Whether the gateway runs the tool loop for a validated Messages request: the client sent
    ``X-GW-MCP: enabled`` and its tools hold an mcp_toolset entry."""
    parsed = request.parsed
    value = header(MCP_HEADER)
    return isinstance(parsed, MessagesRequest) and parsed.has_mcp_toolset and value is not None and (
        value.strip().lower() == b"enabled"
    )


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
        if self.request.stream:
            sent["stream"] = True
        sent["tools"] = [
            *(tool for tool in body.get("tools") or () if tool.get("type") != "mcp_toolset"), *self.toolsets.custom_tools()
        ]  # fmt: skip
        if body.get("tool_choice") is None:
            sent["tool_choice"] = {"type": "auto"}
        return orjson.dumps(sent)

    def _open_turn(self, worker: WorkerHandle, messages: list[Any]) -> Awaitable[RelayAnswer]:
        request = self.request
        return request.dp.relay_for(EXTERNAL, PATH).open(RelayRequest(
            worker, PATH, self._payload(messages), request.stream, request.writer.request_id, request.headers,
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

    async def _read_turn(self, answer: RelayAnswer, out: LoopOutput) -> Turn:
        """A turn the provider answered 200: streamed (relayed as it arrives) or whole."""
        limit = self.request.dp.config.max_buffered_response_bytes
        if self.request.stream:
            return await StreamedTurn(out, self.toolsets.exposed).read(answer, limit)
        return Turn(parse_message(await read_whole(answer, limit)))

    async def _later_turn(self, worker: WorkerHandle, messages: list[Any], out: LoopOutput) -> Turn | None:
        """A turn after the first, through the attempts loop pinned to ``worker``. None when the
        provider refused it and its answer went to the client as it is (a whole answer); in a stream
        the refusal is raised, for the error event."""
        found: list[Turn] = []
        writer = out.writer

        async def deliver(answer: RelayAnswer) -> Delivered:
            if answer.status != 200:
                if not self.request.stream:
                    return await answer.forward(writer)
                limit = self.request.dp.config.max_buffered_response_bytes
                raise _upstream_error(answer.status, await read_whole(answer, limit))
            found.append(await self._read_turn(answer, out))
            return CLEAN  # the turn's usage is counted into the loop's (LoopOutput.count)

        await run_turn(self.request.dp, worker, PATH, writer.clock, lambda at: self._open_turn(at, messages), deliver)
        return found[0] if found else None

    # --- the loop -------------------------------------------------------------------------------------
    async def run(self, worker: WorkerHandle, first: RelayAnswer | None, writer: ResponseWriter) -> Delivered:
        """The loop, answered through ``writer``, with the usage of every turn summed; not clean
        when the worker failed the first turn."""
        request = self.request
        out = LoopOutput(writer, self.id, request.model or str(request.body["model"]), request.stream)
        if not request.stream:
            assert first is not None
            await self._rounds(worker, await self._read_turn(first, out), out)
            return Delivered(True, _token_usage(out.usage))
        await out.open()
        try:
            await self._connect()
            first = await self._open_turn(worker, list(request.body["messages"]))
            if first.status != 200:  # the provider refused the first turn
                raise _upstream_error(first.status, await read_whole(first, request.dp.config.max_buffered_response_bytes))
            turn = await self._read_turn(first, out)
        except UpstreamFailure as failure:  # the worker failed the turn: recorded on its breaker
            await writer.error(failure.to_error())
            return Delivered(False, _token_usage(out.usage))
        except GatewayError as error:
            await writer.error(error)
            return Delivered(True, _token_usage(out.usage))
        try:
            await self._rounds(worker, turn, out)
        except GatewayError as error:
            await writer.error(error)
        return Delivered(True, _token_usage(out.usage))

    async def _rounds(self, worker: WorkerHandle, turn: Turn, out: LoopOutput) -> None:
        messages = list(self.request.body["messages"])
        exposed = self.toolsets.exposed
        rounds = 0
        while True:
            message = turn.message
            out.count(message["usage"])
            content = message["content"]
            unsent = [block for position, block in enumerate(content) if position not in turn.relayed]
            uses = [b for b in content if b["type"] == "tool_use" and b["name"] in exposed]
            own = any(b["type"] == "tool_use" and b["name"] not in exposed for b in content)
            if not uses or message.get("stop_reason") != "tool_use":
                await out.blocks(unsent)
                return await out.finish(message)
            if rounds == MAX_ROUNDS:
                raise errors.mcp_max_iterations(MAX_ROUNDS)
            rounds += 1
            results = await self.toolsets.run([(b["name"], b.get("input") or {}) for b in uses], out.model)
            by_id = {b["id"]: result for b, result in zip(uses, results)}
            shown: list[dict[str, Any]] = []
            for block in unsent:
                result = by_id.get(block.get("id")) if block["type"] == "tool_use" else None
                shown.extend(_mcp_blocks(block, exposed[block["name"]].server, result) if result else (block,))
            await out.blocks(shown)
            if own:
                return await out.finish(message)
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": [_tool_result(b["id"], by_id[b["id"]]) for b in uses]})
            following = await self._later_turn(worker, messages, out)
            if following is None:
                return None  # the provider's refusal was the answer
            turn = following


def _token_usage(usage: Mapping[str, int]) -> TokenUsage:
    """The loop's summed Anthropic counters as accounted: the prompt is every input token (uncached,
    read from and written to the cache)."""
    cached = usage["cache_read_input_tokens"]
    prompt = usage["input_tokens"] + cached + usage["cache_creation_input_tokens"]
    return TokenUsage(prompt, usage["output_tokens"], cached)


def _mcp_blocks(use: Mapping[str, Any], server: str, result: McpToolResult) -> tuple[dict[str, Any], dict[str, Any]]:
    call_id = "mcptoolu_" + str(use["id"]).removeprefix("toolu_")
    return (
        {"type": "mcp_tool_use", "id": call_id, "name": use["name"], "server_name": server, "input": use.get("input") or {}},
        {"type": "mcp_tool_result", "tool_use_id": call_id, "content": [{"type": "text", "text": result.output}],
         "is_error": result.is_error},
    )  # fmt: skip


def _tool_result(tool_use_id: str, result: McpToolResult) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": result.output, "is_error": result.is_error}


class _LoopAnswer:
    """The route's answer: the loop runs when it is forwarded."""

    __slots__ = ("status", "_loop", "_worker", "_first")

    def __init__(self, loop: MessagesMcpLoop, worker: WorkerHandle, first: RelayAnswer | None) -> None:
        self.status = 200
        self._loop = loop
        self._worker = worker
        self._first = first

    async def forward(self, writer: ResponseWriter) -> Delivered:
        return await self._loop.run(self._worker, self._first, writer)

    async def discard(self) -> None:
        if self._first is not None:
            await self._first.discard()

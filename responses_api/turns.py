"""Where a response's model turns run: the seam between the Responses surface and its workers.

A response is one or more model turns (more when the gateway runs MCP tools between them). The
surface (:mod:`responses_api.served`) builds the output items, events, tool loop and storage once;
per worker kind a :class:`ModelTurns` makes the turns:

- on engine workers (gRPC) :class:`EngineTurns` renders each turn as a chat turn of the gateway's
  own pipeline (:class:`~inference.pipeline.chat_turn.ChatTurn`);
- on external providers :class:`~responses_api.provider_turns.ProviderTurns` sends each turn to the
  provider's own /v1/responses.

Either way a started turn hands the surface's :data:`TurnReader` the turn's events in batches (the
pipeline's API-neutral events, plus whole items a provider made that the pipeline has no event for)
and a way to read the turn's usage once the events ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, Sequence, Union

from inference.accounting import Delivered
from inference.pipeline.events import Event, Usage
from inference.pipeline.usage import UsageTally
from inference.routing.workers import WorkerHandle
from inference.served.base import ServedAnswer, ServedRequest
from inference.pipeline.chat_turn import ChatTurn, TurnRun, turn_events
from inference.upstreams.engine import EngineOutput
from inference.writers import ResponseWriter
from responses_api.mcp_tools import McpServers
from responses_api.request import ResponsesRequest
from responses_api.to_chat import ToolNames, chat_messages, chat_tools, responses_turn

__all__ = ["EngineTurns", "ModelTurn", "ModelTurns", "ProviderItem", "TurnEvent", "TurnReader"]


@dataclass(frozen=True, slots=True)
class ProviderItem:
    """A whole output item an external provider made that no pipeline event describes (a
    web_search_call, an image_generation_call, ...): added to the output as it is."""

    item: dict[str, Any]


TurnEvent = Union[Event, ProviderItem]

TurnReader = Callable[[AsyncIterator[Sequence[TurnEvent]], Callable[[], Usage], ResponseWriter], Awaitable[Delivered]]
"""Reads a started turn: its events in batches (flush after each), its usage once they ended, and
the surface's writer. Returns what it came to: not clean when the turn broke off after the response
started; the response's usage (every turn's, summed) when it is the request's answer."""


class ModelTurn(Protocol):
    """One prepared turn; started per attempt (a failure before its first output is retried)."""

    async def open(self, worker: WorkerHandle, read: TurnReader) -> ServedAnswer: ...


class ModelTurns(Protocol):
    """Makes the turns of one response on one kind of worker."""

    def prepare(self, items: list[dict[str, Any]]) -> ModelTurn:
        """The turn over ``items``: the resolved input and what the response produced so far."""
        ...


class _EngineTurn:
    __slots__ = ("chat",)

    def __init__(self, chat: ChatTurn) -> None:
        self.chat = chat

    async def open(self, worker: WorkerHandle, read: TurnReader) -> ServedAnswer:
        async def deliver(run: TurnRun, outputs: AsyncIterator[EngineOutput], writer: ResponseWriter) -> Delivered:
            tally = UsageTally(run.prompt_tokens)

            async def batches() -> AsyncIterator[Sequence[TurnEvent]]:
                async for _choice, events in turn_events(outputs, run.choices(), tally.add):
                    yield events

            return await read(batches(), tally.usage, writer)

        return await self.chat.open(worker, deliver)


class EngineTurns:
    """Turns on engine workers: the request as chat turns of the gateway's pipeline (function tools
    and namespace members as ``ns.name``, MCP tools as functions)."""

    def __init__(
        self, request: ServedRequest, responses: ResponsesRequest, names: ToolNames, mcp: McpServers, response_id: str
    ) -> None:
        self.request = request
        self.responses = responses
        self.names = names
        self.mcp = mcp
        self.response_id = response_id
        self._count = 0

    def prepare(self, items: list[dict[str, Any]]) -> ModelTurn:
        body = self.responses.body
        tools = chat_tools(body.get("tools") or (), self.names, self.mcp.chat_tools())
        messages = chat_messages(body.get("instructions"), items, self.names)
        turn = responses_turn(body, self.request.model, messages, tools, self.names, stream=self.request.stream)
        request_id = self.response_id if not self._count else f"{self.response_id}-{self._count}"
        self._count += 1
        return _EngineTurn(ChatTurn(self.request.target_of, turn, request_id))

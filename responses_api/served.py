"""POST /v1/responses served by the gateway: on gRPC workers as chat turns on the gateway's own
pipeline, on external providers as turns of the provider's /v1/responses (:mod:`responses_api.turns`
makes the turns per worker kind); their events become the response's output items and, when
streaming, the Responses events (spec 2).

- Function tools (and namespace members, shown to the model as ``ns.name`` and mapped back) return
  to the client as function_call items.
- MCP tools (and MCP-backed built-ins) are listed before the first turn (an mcp_list_tools item per
  server) and run by the gateway: each batch of MCP calls the model makes becomes mcp_call items,
  their results go back to the model, and another turn runs on the same worker. At most
  ``max_tool_calls`` calls run (the internal cap is 10: past it the response fails with
  max_tool_calls_exceeded; past the client's own limit it completes with the calls that ran). A turn
  that ends at the token limit, or also made function calls, ends the loop.
- The response completes, is incomplete when max_output_tokens cut it, or fails (``stream_error``
  when the worker broke off mid-stream; ``server_error`` when a later turn could not run), every
  open item closed first and partial output kept. Usage sums every turn. It is stored (history,
  conversations, background runs) the same whoever ran its turns.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Sequence

import orjson

from inference import errors
from inference.accounting import BROKEN, CLEAN, LATER, Delivered
from inference.admission import Admission
from inference.errors import GatewayError
from inference.kit import run_turn
from inference.pipeline.engine_answer import generation_read
from inference.pipeline.events import Usage
from inference.pipeline.usage import token_usage
from inference.routing.workers import WorkerHandle, WorkerType
from common.config import current_config
from inference.served import ServedRequest, ServedSurface
from inference.served.base import LocalAnswer, ServedAnswer
from inference.upstreams.failures import UpstreamFailure
from inference.writers import ResponseWriter
from responses_api.background import BACKGROUND, FeedAnswer, RunFeed, limit_reached, run_writer
from responses_api.mcp_tools import McpServers
from responses_api.ids import new_response_id
from responses_api.items import with_id
from responses_api.scope import scope_of
from responses_api.storage import history_store
from responses_api.storage.base import ConversationNotFound
from responses_api.output import OutputBuilder, terminal_fields, usage_object
from responses_api.reasoning_blob import INCLUDE_ENCRYPTED_REASONING
from responses_api.request import ResponsesRequest, validate_response_request
from responses_api.provider_turns import ProviderFailed, ProviderTurns
from responses_api.to_chat import ToolNames
from responses_api.turns import EngineTurns, ModelTurn, ModelTurns, TurnEvent

__all__ = ["ServedResponses", "response_shell", "INTERNAL_TOOL_CALL_CAP"]

INTERNAL_TOOL_CALL_CAP = 10
"""Gateway-executed tool calls per response, whatever max_tool_calls says (spec 2, Limits)."""


def _given(body: dict[str, Any], key: str, default: Any) -> Any:
    """The request's ``key``, or ``default`` when it is absent or null (null asks for the default)."""
    value = body.get(key)
    return default if value is None else value


def _text_config(text: dict[str, Any] | None) -> dict[str, Any]:
    """The request's text settings, the default format (plain text) where it gave none."""
    return {**(text or {}), "format": _given(text or {}, "format", {"type": "text"})}


def response_shell(request: ResponsesRequest, response_id: str, created_at: int, status: str) -> dict[str, Any]:
    """The response object before any output: the request's settings echoed (spec 2, Response object),
    a setting left out or sent as null echoed as its default, so every field the SDK's Response
    requires non-null has a value; ``user`` appears only when given (the SDK's schema has no null)."""
    body = request.body
    tools = body.get("tools") or []
    shell: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": request.background,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": request.model,
        "output": [],
        "parallel_tool_calls": _given(body, "parallel_tool_calls", True),
        "previous_response_id": request.previous_response_id,
        "reasoning": body.get("reasoning"),
        "store": request.store,
        "temperature": _given(body, "temperature", 1.0),
        "text": _text_config(body.get("text")),
        "tool_choice": _given(body, "tool_choice", "auto" if tools else "none"),
        "tools": tools,
        "top_p": _given(body, "top_p", 1.0),
        "truncation": _given(body, "truncation", "disabled"),
        "usage": None,
        "metadata": body.get("metadata") or {},
    }
    if body.get("user") is not None:
        shell["user"] = body["user"]
    return shell


def event_bytes(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    """One Responses stream event, framed."""
    event = {"type": kind, "sequence_number": sequence, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _as_stored(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as OpenAI lists it back: a message's text content as parts, with a status."""
    stored = dict(item)
    if stored.get("type", "message") == "message":
        stored["type"] = "message"
        if isinstance(stored.get("content"), str):
            if stored.get("role") == "assistant":
                stored["content"] = [{"type": "output_text", "text": stored["content"], "annotations": []}]
            else:
                stored["content"] = [{"type": "input_text", "text": stored["content"]}]
        stored.setdefault("status", "completed")
    return stored


class ServedResponses(ServedSurface):
    def __init__(self, request: ServedRequest) -> None:
        super().__init__(request)
        given = request.parsed
        self.responses = given if isinstance(given, ResponsesRequest) else validate_response_request(request.body)
        body = self.responses.body
        self.id = new_response_id()
        self.created_at = int(time.time())
        self.names = ToolNames()
        given = body["input"]
        own = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else list(given)
        self.input_items = [with_id(_as_stored(item)) for item in own]  # stored as the response's input
        self.items: list[dict[str, Any]] = list(self.input_items)  # history first, once resolved
        self.scope = scope_of(request.identity)
        self.store = history_store()
        self.mcp = McpServers.of_request(body.get("tools") or [])
        self._listed = False
        self._history_read = False
        # Background runs return the queued object at once, or stream the run to the client while it
        # stays; with --max-background-responses 0 every request runs in front.
        self.background = self.responses.background and BACKGROUND.allowed()
        self._first_sequence = 0  # a streamed background run's events follow created and queued
        # Per worker kind, its turns and the response's first turn over them (kept for retries).
        self._turns: dict[bool, tuple[ModelTurns, ModelTurn]] = {}
        self._worker: WorkerHandle | None = None  # the worker of the first turn: later turns run there
        # The worker (or provider) failed the first turn, as against the request's own fault (a
        # tool-call limit, a refusal as invalid): the first attempt's outcome on its breaker. Later
        # turns run through the attempts loop themselves (run_turn), which records theirs.
        self._worker_failed = False

    def _turns_on(self, worker: WorkerHandle) -> tuple[ModelTurns, ModelTurn]:
        """The turns for ``worker``'s kind (the provider's /v1/responses on an external worker, the
        gateway's chat pipeline on an engine) and the first turn over the input."""
        external = worker.record.external
        found = self._turns.get(external)
        if found is None:
            turns: ModelTurns = (
                ProviderTurns(self.request, self.responses, self.names, self.mcp)
                if external
                else EngineTurns(self.request, self.responses, self.names, self.mcp, self.id)
            )
            found = self._turns[external] = (turns, turns.prepare(self.items))
        return found

    async def _read_history(self) -> None:
        """What previous_response_id or conversation continues from, before the request's own input
        (404 not_found for one this scope does not have)."""
        request = self.responses
        history: list[dict[str, Any]] | None = []
        if request.previous_response_id is not None:
            history = await self.store.aresponse_history(self.scope, request.previous_response_id)
            if history is None:
                raise GatewayError(
                    404, "not_found", f"Previous response with id '{request.previous_response_id}' not found.",
                    param="previous_response_id",
                )  # fmt: skip
        elif request.conversation is not None:
            try:
                history = await self.store.aconversation_history(self.scope, request.conversation)
            except ConversationNotFound:
                raise GatewayError(
                    404, "not_found", f"Conversation with id '{request.conversation}' not found.", param="conversation"
                ) from None
        await self._resolve_references()
        self.items = [*(history or ()), *self.input_items]

    async def _resolve_references(self) -> None:
        """Each item_reference of the input as the stored item it names (404 not_found for one this
        scope does not have); the response stores and replays the item itself."""
        wanted = [str(item["id"]) for item in self.input_items if item.get("type") == "item_reference"]
        if not wanted:
            return
        found = await self.store.aget_items(self.scope, wanted)
        for item_id in wanted:
            if item_id not in found:
                raise GatewayError(404, "not_found", f"Item with id '{item_id}' not found.", param="input")
        self.input_items = [
            found[str(item["id"])] if item.get("type") == "item_reference" else item for item in self.input_items
        ]

    async def _save(self, response: dict[str, Any]) -> None:
        """Store the finished response (and append its items to its conversation), unless store is
        false; a background run replaces its queued object, unless it was cancelled meanwhile."""
        conversation = self.responses.conversation is not None
        if self.background:
            await self.store.aupdate_response(
                self.scope, response, only_from=("queued", "in_progress"), append_to_conversation=conversation
            )
        elif self.responses.store:
            await self.store.asave_response(self.scope, response, self.input_items, append_to_conversation=conversation)

    async def _queue(self, worker: WorkerHandle, first: ModelTurn) -> LocalAnswer | FeedAnswer:
        """Store the queued object and start the run behind it; answer the object at once, or, when
        streaming, the run's events (response.created and response.queued first) while the client
        stays."""
        if len(BACKGROUND) >= current_config().max_background_responses:
            raise limit_reached()
        queued = response_shell(self.responses, self.id, self.created_at, "queued")
        if self.responses.conversation is not None:
            queued["conversation"] = {"id": self.responses.conversation}
        await self.store.asave_response(self.scope, queued, self.input_items)
        feed = RunFeed() if self.responses.stream else None
        dp = self.request.dp
        if feed is not None:
            feed.push(event_bytes("response.created", 0, {"response": queued}))
            feed.push(event_bytes("response.queued", 1, {"response": queued}))
            self._first_sequence = 2

        async def fail(message: str) -> None:
            failed = {**queued, "status": "failed", "completed_at": int(time.time()),
                      "error": {"code": "server_error", "message": message}}  # fmt: skip
            if await self.store.aupdate_response(self.scope, failed, only_from=("queued", "in_progress")):
                if feed is not None:
                    feed.push(event_bytes("response.failed", self._first_sequence, {"response": failed}))

        async def run() -> None:
            out = feed.writer(self.id) if feed is not None else run_writer(self.id)
            refused: list[int] = []

            async def deliver(answer: ServedAnswer) -> Delivered:
                if answer.status != 200:  # a provider refused the turn: nobody waits for its answer
                    await answer.discard()
                    refused.append(answer.status)
                    return CLEAN
                return await answer.forward(out)

            account = self.request.account  # the request is this run: accounted when it ends (D66)
            failure: GatewayError | None = None
            ended = False

            try:
                # A run holds a concurrency permit while it runs, as a foreground request does. It
                # waits for one in the same FIFO, however long (its number has its own limit), and
                # stays queued meanwhile; the request that queued it gave its own back on answering.
                async with Admission(dp.permits, None, 0, patient=True):
                    await self.store.aset_response_status(self.scope, self.id, "in_progress", only_from=("queued",))
                    await run_turn(
                        dp, worker, "/v1/responses", out.clock, lambda at: first.open(at, self._deliver), deliver, account
                    )  # fmt: skip
                if refused:
                    await fail(f"Upstream generation failed: the provider answered HTTP {refused[0]}")
                ended = True
            except GatewayError as error:
                failure = error
                await fail(f"Upstream generation failed: {error.message}")
            except asyncio.CancelledError:
                if BACKGROUND.stopping:  # the gateway shuts down: the run cannot finish
                    await fail("The gateway stopped before the response finished")
                raise
            finally:
                if account is not None:
                    account.close(failure, cancelled=failure is None and not ended, by_run=True)
                if feed is not None:
                    feed.close()
                if not self.responses.store and not BACKGROUND.stopping:
                    BACKGROUND.forget_later(lambda: self.store.adelete_response(self.scope, self.id))

        async def cancelled() -> bool:
            if not self.store.keeps_records:  # --history-backend none: nothing can be cancelled
                return False
            stored = await self.store.aget_response(self.scope, self.id)
            return stored is None or stored.get("status") == "cancelled"

        async def heartbeat() -> None:  # still running, or waiting for a permit: the row's updated_at moves on
            if not await self.store.aset_response_status(self.scope, self.id, "in_progress", only_from=("in_progress",)):
                await self.store.aset_response_status(self.scope, self.id, "queued", only_from=("queued",))

        if self.request.account is not None:
            self.request.account.hand_on()  # the run accounts the request when it ends (D66)
        BACKGROUND.start(self.id, run, cancelled, heartbeat)
        return FeedAnswer(feed) if feed is not None else LocalAnswer(orjson.dumps(queued), delivered=LATER)

    async def open(self, worker: WorkerHandle) -> ServedAnswer:
        if worker.record.worker_type == WorkerType.ENCODE:  # an EPD deployment (spec 2: 501)
            raise errors.endpoint_not_supported("/v1/responses", "gRPC EPD")
        if not self._history_read:
            await self._read_history()
            self._history_read = True
        if self.mcp and not self._listed:
            await self.mcp.list_tools()  # 424 connect_mcp_server_failed when a server is not there
            self._listed = True
        _turns, first = self._turns_on(worker)
        self._worker = worker
        if self.background:
            return await self._queue(worker, first)
        return await first.open(worker, self._deliver)

    async def _deliver(
        self, batches: AsyncIterator[Sequence[TurnEvent]], usage: Callable[[], Usage], writer: ResponseWriter
    ) -> Delivered:
        stream = self.responses.stream
        pending = bytearray()
        sequence = self._first_sequence

        def emit(kind: str, fields: dict[str, Any]) -> None:
            nonlocal sequence
            pending.extend(event_bytes(kind, sequence, fields))
            sequence += 1

        async def flush() -> None:
            if pending:
                await writer.chunk(bytes(pending))
                pending.clear()

        response = response_shell(self.responses, self.id, self.created_at, "in_progress")
        if self.responses.conversation is not None:
            response["conversation"] = {"id": self.responses.conversation}
        builder = OutputBuilder(
            self.names, emit if stream else None, self.mcp.tool_labels(),
            seal_reasoning=INCLUDE_ENCRYPTED_REASONING in (self.responses.body.get("include") or ()),
        )  # fmt: skip
        usages: list[Callable[[], Usage]] = []
        writer.usage_so_far = lambda: token_usage(Usage.sum(each() for each in usages))

        async def consume(
            turn_batches: AsyncIterator[Sequence[TurnEvent]], turn_usage: Callable[[], Usage], _: ResponseWriter
        ) -> Delivered:
            usages.append(turn_usage)  # every turn's usage, summed into the response's below
            async for events in turn_batches:
                for event in events:
                    builder.feed(event)
                await flush()
            generation_read()  # the tool rounds and turns after it are not this turn's generation (D104)
            return CLEAN

        if stream:
            await writer.open_stream()
            if not self._first_sequence:  # a streamed background run sent its own (queued) first
                builder.send("response.created", response=dict(response))
            builder.send("response.in_progress", response=dict(response))
        for label, tools in self.mcp.listings():
            builder.mcp_list_tools(label, tools)
        await flush()
        error: dict[str, str] | None = None
        try:
            await consume(batches, usage, writer)
            error = await self._tool_loop(builder, consume, flush, writer)
        except ProviderFailed as failed:  # the provider's own failed response: its code and message kept
            error = {"code": failed.code, "message": failed.detail}
            self._worker_failed = True
        except UpstreamFailure as failure:
            if not stream and not builder.output:
                raise  # nothing produced: the attempts loop may still retry elsewhere
            error = {"code": "stream_error", "message": failure.detail}
            self._worker_failed = not failure.rejected
        cut = builder.finish is not None and builder.finish.reason == "length" and error is None
        builder.close_items(cut=cut, failed=error is not None)
        response["output"] = builder.output
        summed = Usage.sum(each() for each in usages)
        response["usage"] = usage_object(summed)
        if error is not None:
            terminal_fields(response, "failed")
            response["error"] = error
            kind = "response.failed"
        elif cut:
            terminal_fields(response, "incomplete")
            response["incomplete_details"] = {"reason": "max_output_tokens"}
            kind = "response.incomplete"
        else:
            terminal_fields(response, "completed")
            kind = "response.completed"
        await self._save(response)  # before the answer: a GET right after it finds the response
        # The request's answer: the usage of every turn it ran (the tool rounds' turns run through
        # run_turn with no account of their own), accounted once by the route or the background run.
        delivered = Delivered(not self._worker_failed, token_usage(summed))
        if not stream:
            await writer.whole(200, b"application/json", orjson.dumps(response))
            return delivered
        builder.send(kind, response=response)
        await flush()
        await writer.end_stream()
        return delivered

    async def _tool_loop(
        self, builder: OutputBuilder, consume: Any, flush: Any, writer: ResponseWriter
    ) -> dict[str, str] | None:
        """Run the model's MCP calls and the turns after them; the response's error, if it fails."""
        limit = self.responses.body.get("max_tool_calls")
        allowance_total = min(limit, INTERNAL_TOOL_CALL_CAP) if limit else INTERNAL_TOOL_CALL_CAP
        executed = 0
        while True:
            calls = builder.take_mcp_calls()
            if not calls or builder.finish is None or builder.finish.reason == "length":
                return None
            function_calls = any(
                item["type"] == "function_call" and item["status"] == "in_progress" for item in builder.output
            )
            builder.close_items()
            allowed = calls[: max(allowance_total - executed, 0)]
            started = [builder.mcp_call_started(call) for call in allowed]
            await flush()
            for item, result in zip(started, await self.mcp.run(allowed, self.request.model)):
                builder.mcp_call_finished(item, result.output, result.error)
            executed += len(allowed)
            await flush()
            if len(calls) > len(allowed):
                if limit is not None and limit <= INTERNAL_TOOL_CALL_CAP:
                    return None  # the client's limit: complete with the calls that ran
                return {"code": "max_tool_calls_exceeded", "message": f"more than {INTERNAL_TOOL_CALL_CAP} tool calls"}
            if function_calls:
                return None  # the function calls go back to the client
            builder.new_turn()
            produced = [item for item in builder.output if item["type"] != "mcp_list_tools"]
            worker = self._worker
            assert worker is not None
            turns, _first = self._turns_on(worker)
            turn = turns.prepare([*self.items, *produced])
            refused: list[int] = []
            provider_failed: list[ProviderFailed] = []

            async def deliver(answer: ServedAnswer) -> Delivered:
                if answer.status != 200:  # a provider refused the turn (its status counts on its breaker)
                    await answer.discard()
                    refused.append(answer.status)
                    return CLEAN
                try:
                    return await answer.forward(writer)
                except ProviderFailed as failed:  # the provider's own failure: its code and message kept
                    provider_failed.append(failed)
                    return BROKEN

            try:
                await run_turn(self.request.dp, worker, "/v1/responses", writer.clock, lambda at: turn.open(at, consume), deliver)
            except GatewayError as failure:  # the worker's failure, or the turn refused as invalid
                return {"code": "server_error", "message": f"Upstream generation failed: {failure.message}"}
            if provider_failed:
                return {"code": provider_failed[0].code, "message": provider_failed[0].detail}
            if refused:
                return {"code": "server_error", "message": f"Upstream generation failed: HTTP {refused[0]}"}

"""The response object and its streamed events, built from the chat pipeline's events (spec 2,
"Response object" and "Events").

:class:`OutputBuilder` takes one model turn's events (reasoning, text, tool-call deltas, the finish)
and keeps the output items in order: reasoning first as its own item, then the message, then each
function call. With an ``emit`` callback it also produces the stream's events as they happen:
output_item.added, the content events, output_item.done, with ``sequence_number`` from 0 across the
whole stream; every item opened is closed exactly once (:meth:`close_items`), and the caller sends
the one terminal event (:meth:`terminal`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from inference.pipeline.events import Finished, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from inference.pipeline.tools.base import make_call_id
from responses_api.ids import new_item_id
from responses_api.reasoning_blob import seal
from responses_api.to_chat import ToolNames
from responses_api.turns import ProviderItem, TurnEvent

__all__ = ["OutputBuilder", "Emit", "usage_object", "terminal_fields"]

Emit = Callable[[str, dict[str, Any]], None]
"""Sends one stream event: its type and its fields (the builder adds type and sequence_number)."""


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class OutputBuilder:
    """The output items of a response, as events arrive (see the module's docstring)."""

    def __init__(
        self, names: ToolNames, emit: Emit | None = None, mcp_tools: dict[str, str] | None = None,
        *, seal_reasoning: bool = False,
    ) -> None:  # fmt: skip
        self.names = names
        self.seal_reasoning = seal_reasoning  # include reasoning.encrypted_content
        self._emit = emit
        self.mcp_tools = mcp_tools or {}  # tool name → server label: calls the gateway runs itself
        self.mcp_pending: list[dict[str, Any]] = []  # this turn's calls of MCP tools, not yet run
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item receiving deltas (reasoning or message)
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # tool-call index of this turn → its item
        self.finish: Finished | None = None

    def send(self, kind: str, **fields: Any) -> None:
        if self._emit is not None:
            self._emit(kind, fields)

    @property
    def index(self) -> int:
        return len(self.output) - 1

    # --- items ----------------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> None:
        self.output.append(item)
        self.send("response.output_item.added", output_index=self.index, item=dict(item))

    def _open_text_item(self, kind: str) -> dict[str, Any]:
        if self._open is not None and self._open["type"] == kind:
            return self._open
        self._close_open()
        if kind == "reasoning":
            item: dict[str, Any] = {"id": new_item_id("reasoning"), "type": "reasoning", "summary": [], "content": [],
                                    "status": "in_progress"}  # fmt: skip
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_item_id("message"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._add(item)
        self.send("response.content_part.added", item_id=item["id"], output_index=self.index, content_index=0, part=part)
        self._open = item
        self._text = []
        return item

    def _close_open(self, status: str = "completed") -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        text = "".join(self._text)
        index = self.output.index(item)
        if item["type"] == "reasoning":
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            self.send("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text)
            item["status"] = "completed"  # reasoning items are always completed (spec 2)
            if self.seal_reasoning:
                item["encrypted_content"] = seal(text)
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            self.send("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                      logprobs=[])  # fmt: skip
            item["status"] = status
        item["content"] = [part]
        self.send("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part)
        self.send("response.output_item.done", output_index=index, item=dict(item))

    def feed(self, event: TurnEvent) -> None:
        if isinstance(event, ReasoningDelta):
            item = self._open_text_item("reasoning")
            self._text.append(event.text)
            self.send("response.reasoning_text.delta", item_id=item["id"], output_index=self.index, content_index=0,
                      delta=event.text)  # fmt: skip
        elif isinstance(event, TextDelta):
            if not event.text:
                return
            item = self._open_text_item("message")
            self._text.append(event.text)
            self.send("response.output_text.delta", item_id=item["id"], output_index=self.index, content_index=0,
                      delta=event.text, logprobs=[])  # fmt: skip
        elif isinstance(event, ToolCallDelta):
            self._call(event)
        elif isinstance(event, ProviderItem):
            self._close_open()
            self._add(event.item)  # whole, as the provider made it
            self.send("response.output_item.done", output_index=self.index, item=dict(event.item))
        else:
            self.finish = event

    def _call(self, event: ToolCallDelta) -> None:
        call = self._calls.get(event.index)
        if call is None and event.name in self.mcp_tools:
            # An MCP-bound call: no function_call events (spec 2); the gateway runs it after the turn.
            self._close_open()
            pending = {"call_id": event.id or make_call_id(), "name": event.name, "arguments": "",
                       "server_label": self.mcp_tools[event.name], "index": event.index}  # fmt: skip
            self.mcp_pending.append(pending)
            self._calls[event.index] = pending
            return
        if call is not None and call.get("type") is None:  # arguments of a pending MCP call
            call["arguments"] += event.arguments_delta
            return
        if call is None:
            self._close_open()
            namespace, name = self.names.resolve(event.name or "")
            call = {"id": new_item_id("function_call"), "type": "function_call", "status": "in_progress",
                    "call_id": event.id or make_call_id(), "name": name, "arguments": ""}  # fmt: skip
            if namespace is not None:
                call["namespace"] = namespace
            self._calls[event.index] = call
            self._add(call)
        if event.arguments_delta:
            call["arguments"] += event.arguments_delta
            self.send("response.function_call_arguments.delta", item_id=call["id"],
                      output_index=self.output.index(call), delta=event.arguments_delta)  # fmt: skip

    def close_items(self, *, cut: bool = False, failed: bool = False) -> None:
        """Close every open item once: ``cut`` (max_output_tokens) leaves a message incomplete and a
        call's arguments incomplete; ``failed`` leaves them in_progress (partial output kept)."""
        text_status = "in_progress" if failed else "incomplete" if cut else "completed"
        self._close_open(text_status)
        for call in self._calls.values():
            if call.get("type") is None or call["status"] != "in_progress":
                continue
            call["status"] = "in_progress" if failed else "incomplete" if cut else "completed"
            index = self.output.index(call)
            self.send("response.function_call_arguments.done", item_id=call["id"], output_index=index,
                      arguments=call["arguments"], name=call["name"])  # fmt: skip
            self.send("response.output_item.done", output_index=index, item=dict(call))
        self._calls = {}

    def function_calls(self) -> list[dict[str, Any]]:
        return [item for item in self.output if item["type"] == "function_call"]

    def take_mcp_calls(self) -> list[dict[str, Any]]:
        calls, self.mcp_pending = self.mcp_pending, []
        return calls

    def new_turn(self) -> None:
        self.finish = None

    # --- MCP items ----------------------------------------------------------------------------------

    def mcp_list_tools(self, server_label: str, tools: list[dict[str, Any]]) -> None:
        item: dict[str, Any] = {"id": new_item_id("mcp_list_tools"), "type": "mcp_list_tools", "server_label": server_label, "tools": []}
        self._add(item)
        self.send("response.mcp_list_tools.in_progress", output_index=self.index, item_id=item["id"])
        item["tools"] = tools
        self.send("response.mcp_list_tools.completed", output_index=self.index, item_id=item["id"])
        self.send("response.output_item.done", output_index=self.index, item=dict(item))

    def mcp_call_started(self, call: dict[str, Any]) -> dict[str, Any]:
        """Open the mcp_call item of a pending call (its arguments as one delta, as spec 2 says)."""
        item: dict[str, Any] = {"id": new_item_id("mcp_call"), "type": "mcp_call", "status": "in_progress", "name": call["name"],
                "arguments": call["arguments"], "server_label": call["server_label"], "output": None,
                "error": None}  # fmt: skip
        self._add(item)
        index = self.index
        self.send("response.mcp_call.in_progress", output_index=index, item_id=item["id"])
        self.send("response.mcp_call_arguments.delta", output_index=index, item_id=item["id"], delta=call["arguments"])
        self.send("response.mcp_call_arguments.done", output_index=index, item_id=item["id"], arguments=call["arguments"])
        return item

    def mcp_call_finished(self, item: dict[str, Any], output: str, error: str | None) -> None:
        """Close an mcp_call item: completed with its output, or failed with the gateway's
        mcp_tool_execution_error (the failure text still goes back to the model)."""
        index = self.output.index(item)
        item["output"] = output
        if error is None:
            item["status"] = "completed"
            self.send("response.mcp_call.completed", output_index=index, item_id=item["id"])
        else:
            item["status"] = "failed"
            item["error"] = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": error}]}
            self.send("response.mcp_call.failed", output_index=index, item_id=item["id"], error=error)
        self.send("response.output_item.done", output_index=index, item=dict(item))


def terminal_fields(response: dict[str, Any], status: str) -> None:
    """Set the terminal status (and completed_at) on ``response``."""
    response["status"] = status
    if status in ("completed", "incomplete", "failed", "cancelled"):
        response["completed_at"] = int(time.time())

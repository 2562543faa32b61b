"""A Responses request as the typed :class:`~inference.pipeline.turn.Turn` the gateway's chat pipeline
runs on gRPC workers (spec 2: input items, tools, reasoning and text format on gRPC workers).

- ``instructions`` become the first system message; a text input one user message;
- message items keep their role, their text parts joined as the template reads them;
- consecutive function_call items become one assistant message's tool calls, and a
  function_call_output the tool message answering its call_id (text parts concatenated in order,
  media refused);
- namespace members are presented to the model as ``<namespace>.<name>``; :class:`ToolNames` maps a
  called name back to (namespace, name);
- the sampling fields go to the engine's sampling (max_output_tokens as its token limit), the
  reasoning tier as the template's thinking effort (a reasoning object without effort is medium),
  text.format as the response format (and its constraint), top_logprobs as logprobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from inference.errors import invalid_request
from inference.pipeline.sampling import format_constraint, stop_strings, tool_constraint
from inference.pipeline.templates import ThinkingControl
from inference.pipeline.tool_choice import ToolChoice, resolve_tool_choice
from inference.pipeline.turn import TemplateOptions, Turn
from inference.upstreams.engine import SamplingParams
from responses_api.reasoning_blob import unseal

__all__ = ["ToolNames", "chat_messages", "chat_tools", "responses_turn"]

_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")


@dataclass
class ToolNames:
    """The names the model sees for the request's function tools, and what each maps back to."""

    by_visible: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def add(self, namespace: str | None, name: str) -> str:
        visible = f"{namespace}.{name}" if namespace else name
        self.by_visible[visible] = (namespace, name)
        return visible

    def resolve(self, visible: str) -> tuple[str | None, str]:
        """(namespace, name) of a called name; an undeclared name is returned as it is."""
        return self.by_visible.get(visible, (None, visible))


def _text(content: Any, param: str, *, media: bool) -> Any:
    """String content; parts as chat parts (text joined when no media is allowed)."""
    if isinstance(content, str) or content is None:
        return content or ""
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            texts.append(str(part.get("text", "")))
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif media and kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise invalid_request(f"{param}[{index}]: content part type {kind!r} is not supported here", param)
    if not media:
        return "".join(texts)  # concatenated in order (a function_call_output's parts)
    return parts


def chat_messages(instructions: str | None, items: Iterable[Mapping[str, Any]], names: ToolNames) -> list[dict[str, Any]]:
    """The chat messages of the resolved input (history first, then the request's own items)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    pending_reasoning: str | None = None
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        param = f"input[{index}]"
        if kind == "message":
            message: dict[str, Any] = {
                "role": item["role"],
                "content": _text(item.get("content"), f"{param}.content", media=item["role"] == "user"),
            }
            if item["role"] == "assistant" and pending_reasoning:
                message["reasoning_content"] = pending_reasoning
            pending_reasoning = None
            messages.append(message)
        elif kind == "reasoning":
            parts = [*(item.get("content") or ()), *(item.get("summary") or ())]
            pending_reasoning = "".join(str(part.get("text", "")) for part in parts if isinstance(part, Mapping)) or None
            blob = item.get("encrypted_content")
            if pending_reasoning is None and isinstance(blob, str) and blob:
                pending_reasoning = unseal(blob)
                if pending_reasoning is None:
                    raise invalid_request(
                        f"{param}.encrypted_content could not be decoded", f"{param}.encrypted_content"
                    )
        elif kind in ("function_call", "mcp_call"):
            name = str(item.get("name", ""))
            visible = names.add(item.get("namespace"), name) if kind == "function_call" else name
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": visible, "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                assistant: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
                if pending_reasoning:
                    assistant["reasoning_content"] = pending_reasoning
                    pending_reasoning = None
                messages.append(assistant)
            if kind == "mcp_call":  # a call the gateway ran: its output follows as the tool's answer
                output = item.get("output") if item.get("error") is None else json.dumps(item.get("error"))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(output or "")})
        elif kind == "function_call_output":
            messages.append({
                "role": "tool",
                "tool_call_id": item["call_id"],
                "content": _text(item.get("output"), f"{param}.output", media=False),
            })  # fmt: skip
        # mcp_list_tools, item_reference (resolved before), approvals: nothing for the template
    return messages


def _function(tool: Mapping[str, Any], visible: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": visible, "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def chat_tools(tools: Iterable[Mapping[str, Any]], names: ToolNames, extra: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Function and namespace tools as chat tools (namespace members as ``ns.name``), plus ``extra``
    (the MCP servers' tools, already chat-shaped)."""
    found: list[dict[str, Any]] = []
    for tool in tools:
        if tool.get("type") == "function":
            found.append(_function(tool, names.add(None, str(tool["name"]))))
        elif tool.get("type") == "namespace":
            for member in tool.get("tools") or ():
                if member.get("type") == "function":
                    found.append(_function(member, names.add(str(tool["name"]), str(member["name"]))))
    found.extend(extra)
    return found


def _tool_choice(choice: Any, names: ToolNames) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    kind = choice.get("type")
    if kind == "function":
        namespace = choice.get("namespace")
        visible = f"{namespace}.{choice['name']}" if namespace else str(choice["name"])
        return {"type": "function", "function": {"name": visible}}
    if kind == "allowed_tools":
        return {"type": "allowed_tools", "mode": choice.get("mode", "auto"), "tools": choice.get("tools", [])}
    return "required" if kind == "mcp" else "auto"


def _response_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """text.format as a chat response_format (json_schema or json_object; text: none)."""
    fmt = (body.get("text") or {}).get("format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt["name"], "schema": fmt["schema"], "strict": fmt.get("strict", False)},
        }
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


def _sampling(body: Mapping[str, Any], choice: ToolChoice, response_format: dict[str, Any] | None) -> SamplingParams:
    values: dict[str, Any] = {key: body[key] for key in _SAMPLING if body.get(key) is not None}
    values["stop"] = stop_strings(body)
    if body.get("max_output_tokens") is not None:
        values["max_new_tokens"] = body["max_output_tokens"]
    if body.get("top_logprobs") or "message.output_text.logprobs" in (body.get("include") or ()):
        values["logprobs"] = True
        values["top_logprobs"] = int(body.get("top_logprobs") or 0)
    constraint = tool_constraint(choice if choice.constrained else None) or format_constraint(response_format)
    return SamplingParams(**values, constraint=constraint)


def responses_turn(
    body: Mapping[str, Any], model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], names: ToolNames,
    *, stream: bool,
) -> Turn:  # fmt: skip
    """One model turn of a validated Responses request, over ``messages`` with ``tools`` (chat-shaped,
    as the template reads them)."""
    chosen = _tool_choice(body.get("tool_choice"), names) if tools else None
    choice = resolve_tool_choice({"tools": tools, "tool_choice": chosen})
    response_format = _response_format(body)
    reasoning = body.get("reasoning")
    effort = (reasoning.get("effort") or "medium") if isinstance(reasoning, Mapping) else None
    return Turn(
        model=model,
        messages=messages,
        tool_choice=choice,
        sampling=_sampling(body, choice, response_format),
        stream=stream,
        template=TemplateOptions(thinking=ThinkingControl(effort=effort), response_format=response_format),
        prompt_param="input",
    )

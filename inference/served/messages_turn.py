"""A Messages request as the typed :class:`~inference.pipeline.turn.Turn` the gateway's chat pipeline
runs on engine workers (spec 1, "Messages-style API", gRPC and ZMQ handling), for POST /v1/messages
and POST /v1/messages/count_tokens alike (so a count is the prompt a message would send).

- ``system`` (its text blocks joined by newlines) becomes the first system message; a system turn
  inside ``messages`` stays a system message;
- a user turn's text and image blocks become chat content parts (an image as an ``image_url`` part,
  a base64 source as a data URL: the template writes its placeholder); a document becomes its text (a
  text source's data, or the text blocks of a content source; another source is refused, 400
  process_messages_failed); a search_result its text blocks; each tool_result becomes the tool
  message answering its tool_use_id, in the order the blocks come;
- an assistant turn's text blocks become its content, its thinking blocks its reasoning_content and
  its tool_use blocks its tool calls (the input object as the call's arguments); a final assistant
  turn with text is continued, not answered (Anthropic's prefill);
- custom tools become function tools (their input_schema the parameters); other tool types are
  dropped; tool_choice auto → auto, any → required, tool → that function, none → none (no
  tool_choice: auto), required and named enforced by the constraint;
- thinking enabled or adaptive turns template thinking and the reasoning parser on, disabled turns
  both off (none given: the template's default, reasoning separated); budget_tokens and display
  are unused;
- max_tokens, temperature, top_p, top_k and stop_sequences go to the sampling (stop sequences are
  matched by the gateway as chat's stop strings are, D33).

Blocks no template reads (redacted_thinking, server tool blocks and their results, tool_reference)
are left out of the prompt.
"""

from __future__ import annotations

from typing import Any

from inference.errors import GatewayError
from inference.pipeline.sampling import tool_constraint
from inference.pipeline.templates import ChatTemplateError, ThinkingControl
from inference.pipeline.tool_choice import resolve_tool_choice
from inference.pipeline.turn import OutputOptions, TemplateOptions, Turn
from inference.schemas.messages import CustomTool, MessagesRequest
from inference.schemas.messages import ToolChoice as MessagesToolChoice
from inference.upstreams.engine import SamplingParams

__all__ = ["chat_messages", "has_images", "messages_turn"]

_THINKING_ON = ThinkingControl(type="enabled")
_THINKING_OFF = ThinkingControl(type="disabled")


def _refused(message: str) -> GatewayError:
    """A request that does not render: 400 process_messages_failed (spec 1, Token counting)."""
    return ChatTemplateError(message).as_gateway_error()


def _document_text(block: dict[str, Any], param: str) -> str:
    source = block["source"]
    kind = source.get("type")
    if kind == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if kind == "content":
        content = source.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(
                str(part["text"]) for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
    raise _refused(f"{param}: a document is rendered as its text, and a {kind!r} source has none")


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    source = block["source"]
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
    else:
        url = str(source.get("url") or source.get("file_id") or "")
    return {"type": "image_url", "image_url": {"url": url}}


def _part(block: dict[str, Any], param: str) -> dict[str, Any] | None:
    """A user-side block as a chat content part (None: nothing the template reads)."""
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "image":
        return _image_part(block)
    if kind == "document":
        return {"type": "text", "text": _document_text(block, param)}
    if kind == "search_result":
        return {"type": "text", "text": "\n".join(str(part["text"]) for part in block["content"])}
    return None


def _tool_message(block: dict[str, Any], param: str) -> dict[str, Any]:
    content = block.get("content")
    if not isinstance(content, list):
        text: Any = content or ""
    else:
        parts = [part for j, nested in enumerate(content) if (part := _part(nested, f"{param}.content[{j}]"))]
        images = any(part["type"] == "image_url" for part in parts)
        text = parts if images else "\n".join(part["text"] for part in parts)
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _user_turn(role: str, blocks: list[dict[str, Any]], i: int, out: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        param = f"messages[{i}].content[{j}]"
        if block["type"] == "tool_result":
            if parts:
                out.append({"role": role, "content": parts})
                parts = []
            out.append(_tool_message(block, param))
            continue
        part = _part(block, param)
        if part is not None:
            parts.append(part)
    if parts:
        out.append({"role": role, "content": parts})


def _assistant_turn(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(block["text"])
        elif kind == "thinking":
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": block["input"]}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(request: MessagesRequest) -> list[dict[str, Any]]:
    """The request's system and messages as chat messages (the template's input)."""
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": "\n".join(request.system)})
    for i, message in enumerate(request.messages):
        role = message["role"]
        content = message["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif role == "assistant":
            out.append(_assistant_turn(content))
        else:
            _user_turn(role, content, i, out)
    return out


def has_images(request: MessagesRequest) -> bool:
    """Whether any message holds an image block (at the top level or inside a tool_result)."""
    for message in request.messages:
        content = message["content"]
        if isinstance(content, str):
            continue
        for block in content:
            if block["type"] == "image":
                return True
            nested = block.get("content") if block["type"] == "tool_result" else None
            if isinstance(nested, list) and any(part["type"] == "image" for part in nested):
                return True
    return False


def _tool(tool: CustomTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: MessagesToolChoice | None) -> Any:
    if choice is None or choice.kind == "auto":
        return "auto"
    if choice.kind == "any":
        return "required"
    if choice.kind == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return "none"


def _continues(messages: list[dict[str, Any]]) -> bool:
    """A final assistant turn with text and no tool calls is continued (Anthropic's prefill)."""
    last = messages[-1] if messages else None
    return last is not None and last["role"] == "assistant" and bool(last["content"]) and "tool_calls" not in last


def messages_turn(request: MessagesRequest, model: str, *, stream: bool) -> Turn:
    """The turn of a validated Messages (or count_tokens) request. Raises GatewayError 400
    process_messages_failed for a document without text."""
    messages = chat_messages(request)
    tools = [_tool(tool) for tool in request.custom_tools]
    choice = resolve_tool_choice({"tools": tools, "tool_choice": _chat_tool_choice(request.tool_choice)})
    values: dict[str, Any] = {
        "max_new_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
    }
    sampling = SamplingParams(
        **{key: value for key, value in values.items() if value is not None},
        stop=request.stop_sequences,
        constraint=tool_constraint(choice if choice.constrained else None),
    )
    thinking = request.thinking
    if thinking is None:
        control, separate = ThinkingControl(), True
    elif thinking.kind == "disabled":
        control, separate = _THINKING_OFF, False
    else:
        control, separate = _THINKING_ON, True
    return Turn(
        model=model,
        messages=messages,
        tool_choice=choice,
        sampling=sampling,
        stream=stream,
        template=TemplateOptions(thinking=control, continue_final_message=_continues(messages)),
        output=OutputOptions(separate_reasoning=separate),
    )

"""A stored response or conversation as the conversation it holds, for the admin console: its items
in order (instructions, messages, reasoning, tool calls and their results, MCP calls), each as a turn
with a heading and its readable text, and the item's raw JSON a click away.

Stored items are shown, never trusted: any JSON shape is read (a part that is not an object, a
missing field, a number where text was expected) and every string goes through the template's
escaping, so stored content cannot become markup on the page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from django.template.loader import render_to_string
from django.utils.safestring import SafeString

from responses_api.models import Item

__all__ = ["Turn", "transcript", "render_transcript", "item_turn"]

_TEMPLATE = "admin/responses_api/_transcript.html"


@dataclass(frozen=True, slots=True)
class Turn:
    """One item as the transcript shows it. ``css``: the turn's look (user, assistant, system,
    reasoning, tool-call, tool-result, other); ``side``: input or output (empty for instructions)."""

    css: str
    heading: str
    text: str
    label: str
    raw: str
    side: str = ""


def _raw(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _string(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _raw(value)


def _part_text(part: Any) -> str:
    if not isinstance(part, Mapping):
        return _string(part)
    kind = part.get("type")
    if isinstance(part.get("text"), str):
        return str(part["text"])
    if kind == "refusal":
        return f"[refusal] {_string(part.get('refusal'))}"
    if kind == "input_image":
        return "[image]"
    if kind == "input_file":
        name = _string(part.get("filename") or part.get("file_id"))
        return f"[file {name}]" if name else "[file]"
    return _raw(part)


def _text(content: Any) -> str:
    """Content as text: a string as it is, parts joined by blank lines, anything else as JSON."""
    if isinstance(content, list):
        return "\n\n".join(text for text in (_part_text(part) for part in content) if text)
    return _string(content)


def _arguments(arguments: Any) -> str:
    """A call's arguments, pretty when they are JSON (as the model gave them otherwise)."""
    if isinstance(arguments, str):
        try:
            return _raw(json.loads(arguments))
        except ValueError:
            return arguments
    return _string(arguments)


def _turn(body: Mapping[str, Any]) -> tuple[str, str, str]:
    """(css, heading, text) of one item body."""
    kind = _string(body.get("type") or "message")
    if kind == "message":
        role = _string(body.get("role")) or "message"
        css = role if role in ("user", "assistant", "system", "developer") else "other"
        return ("system" if css == "developer" else css), role, _text(body.get("content"))
    if kind == "reasoning":
        text = "\n\n".join(part for part in (_text(body.get("summary")), _text(body.get("content"))) if part)
        if not text and body.get("encrypted_content"):
            text = "(encrypted)"
        return "reasoning", "reasoning", text
    if kind == "function_call":
        heading = f"tool call {_string(body.get('name'))} ({_string(body.get('call_id'))})"
        return "tool-call", heading, _arguments(body.get("arguments"))
    if kind == "function_call_output":
        return "tool-result", f"tool result ({_string(body.get('call_id'))})", _text(body.get("output"))
    if kind == "mcp_call":
        name = f"{_string(body.get('server_label'))}.{_string(body.get('name'))}"
        outcome = body.get("error") if body.get("error") else body.get("output")
        text = _arguments(body.get("arguments"))
        if outcome is not None:
            text = f"{text}\n\n→ {_string(outcome)}"
        return "tool-call", f"MCP call {name}", text
    if kind == "mcp_list_tools":
        tools = body.get("tools")
        listed: list[Any] = tools if isinstance(tools, list) else []
        names = [_string(tool.get("name")) for tool in listed if isinstance(tool, Mapping)]
        return "other", f"MCP tools of {_string(body.get('server_label'))}", ", ".join(names)
    return "other", kind, ""


def item_turn(item: Item, side: str = "") -> Turn:
    body = item.body if isinstance(item.body, Mapping) else {"type": item.type, "content": item.body}
    css, heading, text = _turn(body)
    return Turn(css=css, heading=heading, text=text, label=str(item), raw=_raw(item.body), side=side)


def transcript(items: Iterable[tuple[str, Item]], instructions: Any = None) -> list[Turn]:
    """The turns of ``items`` ((side, item) in order), after the instructions when there are some."""
    turns = []
    if isinstance(instructions, str) and instructions:
        turns.append(Turn(css="system", heading="instructions", text=instructions, label="",
                          raw=_raw(instructions)))
    turns.extend(item_turn(item, side) for side, item in items)
    return turns


def render_transcript(turns: list[Turn]) -> SafeString:
    """The turns as HTML (the template escapes every value)."""
    return SafeString(render_to_string(_TEMPLATE, {"turns": turns}))

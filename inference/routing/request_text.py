"""The text of a request that cache-aware routing matches prefixes on."""

from __future__ import annotations

from typing import Any

__all__ = ["request_text"]

# Fields read, in order: system prompts first, then the conversation or prompt.
_FIELDS = ("system", "instructions", "messages", "prompt", "input", "text", "input_ids")
_MAX_DEPTH = 6


def request_text(body: Any) -> str:
    """The request's text, in order, as one string ("" when there is none).

    - chat ``messages``: each message as ``role: `` then its content (a string, or the text of its
      parts), one per line; Anthropic ``system`` and Responses ``instructions`` come first;
    - completions ``prompt``: a string, a list of strings, or token ids (a list of ints, written as
      space-separated numbers), or a list of those;
    - ``input`` (Responses, embeddings), ``text`` and ``input_ids`` (native generate) likewise.

    Images, audio and other non-text parts are skipped. Never raises, whatever the shape.
    """
    if not isinstance(body, dict):
        return ""
    out: list[str] = []
    try:
        for name in _FIELDS:
            value = body.get(name)
            if value is not None:
                _collect(value, out, 0)
    except (TypeError, ValueError, RecursionError):  # pragma: no cover - _collect checks every type
        pass
    return "\n".join(out)


def _collect(value: Any, out: list[str], depth: int) -> None:
    if isinstance(value, str):
        if value:
            out.append(value)
    elif isinstance(value, list):
        if depth >= _MAX_DEPTH or not value:
            return
        if _all_ints(value):
            out.append(" ".join(map(str, value)))
            return
        for item in value:
            _collect(item, out, depth + 1)
    elif isinstance(value, dict):
        if depth >= _MAX_DEPTH:
            return
        role = value.get("role")
        if isinstance(role, str) and role:
            out.append(role + ":")
        for key in ("content", "text", "output"):
            inner = value.get(key)
            if inner is not None:
                _collect(inner, out, depth + 1)


def _all_ints(values: list[Any]) -> bool:
    for item in values:
        if type(item) is not int:
            return False
    return True

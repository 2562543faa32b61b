"""The streaming tool-call parser every family builds on.

A parser is fed the content text (after the reasoning parser) in chunks of any size, split
anywhere, and returns :class:`TextDelta` and :class:`ToolCallDelta` events:

- Text outside tool-call regions streams through at once, except what may be the start of a
  marker: that is held back until it is decided, and released as text if it was not a marker.
- A tool-call *region* starts at one of the family's start markers (or, for the formats without
  one, at the very start of the output: Llama's bare JSON, pythonic ``[f(...)]``, plain JSON). A
  region with a closing marker is decided when the marker arrives; one without (Mistral, Llama,
  pythonic, JSON: the calls are the rest of the message) at the end of the output.
- A decided region yields its calls in order: for each, a first delta with ``id`` and ``name``,
  then one delta with the whole arguments as JSON text (``json.dumps``, non-ASCII kept). Calls are
  emitted whole when they are decided, never half: that is what lets a malformed call fall back
  to text in a stream exactly as in :meth:`ToolParser.parse`.
- A region that does not parse (malformed JSON, a missing name, an output cut inside the region)
  is not a tool call: its text, markers included, is content, as the model wrote it. Nothing is
  ever raised to the caller.
- Whitespace next to a region (the newlines between ``</tool_call>`` and ``<tool_call>``, before
  the first call, after the last) is not content; at the end of an output with calls, trailing
  whitespace is dropped.
- ``drop_markers`` (section wrappers such as DeepSeek's ``<｜tool▁calls▁begin｜>``) never reach
  the content.
- ``special_markers``: the format's markers that a tokenizer may hold as special tokens (Mistral's
  ``[TOOL_CALLS]``, Llama's ``<|python_tag|>``). Decoding with ``skip_special_tokens`` (the
  default) would remove them before the parser sees them, so a request this parser reads decodes
  those of them its tokenizer holds as special, and still skips every other special token (the
  chat turn's detokenize settings, :mod:`inference.pipeline.chat_turn`).

:meth:`ToolParser.parse` runs the same machine over the whole text, so the two always agree.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

from inference.pipeline.events import TextDelta, ToolCall, ToolCallDelta

__all__ = [
    "ParsedCall", "ParsedTools", "RegionResult", "ToolEvent", "ToolParser", "ToolSchemas",
    "TaggedToolParser", "arguments_json", "call_from_object", "make_call_id", "partial_suffix",
    "typed_value",
]  # fmt: skip

ToolEvent = TextDelta | ToolCallDelta
ToolSchemas = Mapping[str, Mapping[str, Any]]
"""Function name → its JSON Schema ``parameters`` (from the request's tools)."""


def make_call_id() -> str:
    """An OpenAI-style call ID: ``call_`` and 24 hex characters."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One call found in a region. ``arguments`` is JSON text; ``id`` only when the model wrote
    one (Kimi's ``functions.name:0``, Mistral's call IDs)."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class RegionResult:
    """A decided region: it took ``consumed`` characters from the start of the buffer; ``calls``
    None means it was not a valid tool call, so those characters are content."""

    consumed: int
    calls: tuple[ParsedCall, ...] | None


@dataclass(frozen=True, slots=True)
class ParsedTools:
    """The non-streaming result."""

    content: str
    tool_calls: tuple[ToolCall, ...]


def partial_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest proper prefix of any marker that ``text`` ends with."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def arguments_json(arguments: Any) -> str | None:
    """Arguments as JSON object text, or None when they are not an object. A string holding a
    JSON object (some models encode twice) counts; a missing value is ``{}``."""
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
    if not isinstance(arguments, dict):
        return None
    return json.dumps(arguments, ensure_ascii=False)


def call_from_object(item: Any, *, keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedCall | None:
    """A call from ``{"name": ..., "arguments"|"parameters": {...}}``, or None."""
    if not isinstance(item, dict):
        return None
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return None
    present = [key for key in keys if key in item]
    arguments = arguments_json(item[present[0]] if present else None)
    if arguments is None:
        return None
    call_id = item.get("id")
    return ParsedCall(name, arguments, call_id if isinstance(call_id, str) and call_id else None)


def typed_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """An XML-ish argument value (GLM, MiniMax) as JSON: kept a string when the tool's schema
    says string (or allows only strings); otherwise decoded as JSON when it is JSON, else a
    string."""
    kind = schema.get("type") if schema else None
    if kind == "string" or (isinstance(kind, list) and kind and all(k in ("string", "null") for k in kind)):
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
        return raw


class ToolParser(ABC):
    """A streaming tool-call parser. A family sets the markers and implements
    :meth:`_decide_region` (and :meth:`_opens_at_start` for formats without a start marker)."""

    start_markers: ClassVar[tuple[str, ...]] = ()
    drop_markers: ClassVar[tuple[str, ...]] = ()
    special_markers: ClassVar[tuple[str, ...]] = ()
    """The markers a tokenizer may hold as special tokens: kept when the output is decoded."""

    def __init__(self, *, tools: ToolSchemas | None = None, make_id: Callable[[], str] = make_call_id) -> None:
        self._tools = tools or {}
        self._make_id = make_id
        self._markers = (*self.start_markers, *self.drop_markers)
        self._marker_starts = frozenset(marker[0] for marker in self._markers if marker)
        self._buf = ""
        self._at_output_start = True
        self._in_region = False
        self._skip_space = False
        self._calls = 0

    # --- public ------------------------------------------------------------------------------

    def feed(self, text: str) -> list[ToolEvent]:
        """Events for the next piece of content text."""
        self._buf += text
        out: list[ToolEvent] = []
        self._advance(out, final=False)
        return out

    def finish(self) -> list[ToolEvent]:
        """Events for whatever is still held at the end of the output."""
        out: list[ToolEvent] = []
        self._advance(out, final=True)
        return out

    @property
    def has_tool_calls(self) -> bool:
        """Whether any call was emitted (the finish reason becomes tool_calls)."""
        return self._calls > 0

    @classmethod
    def parse(
        cls, text: str, *, tools: ToolSchemas | None = None, make_id: Callable[[], str] = make_call_id
    ) -> ParsedTools:
        """The whole output at once: (content, calls)."""
        parser = cls(tools=tools, make_id=make_id)
        content: list[str] = []
        names: dict[int, tuple[str, str]] = {}
        arguments: dict[int, list[str]] = {}
        for event in [*parser.feed(text), *parser.finish()]:
            if isinstance(event, TextDelta):
                content.append(event.text)
            else:
                if event.name is not None:
                    names[event.index] = (event.id or "", event.name)
                arguments.setdefault(event.index, []).append(event.arguments_delta)
        calls = tuple(
            ToolCall(index, call_id, name, "".join(arguments.get(index, ())))
            for index, (call_id, name) in sorted(names.items())
        )
        return ParsedTools("".join(content), calls)

    # --- for families ------------------------------------------------------------------------

    def _opens_at_start(self, text: str) -> bool | None:
        """For formats whose calls may begin the output without a marker: given the output so
        far without leading whitespace, True (a region starts here), False, or None (undecided)."""
        return False

    @abstractmethod
    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        """``region`` starts at a start marker (or at the output's start, see
        :meth:`_opens_at_start`) and holds everything received after it. Return None while
        undecided (never when ``final``)."""

    def _schema(self, function: str, argument: str) -> Mapping[str, Any] | None:
        properties = (self._tools.get(function) or {}).get("properties")
        if isinstance(properties, Mapping):
            found = properties.get(argument)
            return found if isinstance(found, Mapping) else None
        return None

    # --- the machine -------------------------------------------------------------------------

    def _text(self, out: list[ToolEvent], text: str) -> None:
        if text:
            out.append(TextDelta(text))

    def _call(self, out: list[ToolEvent], call: ParsedCall) -> None:
        index = self._calls
        self._calls += 1
        out.append(ToolCallDelta(index, call.id or self._make_id(), call.name, ""))
        out.append(ToolCallDelta(index, None, None, call.arguments))

    def _advance(self, out: list[ToolEvent], *, final: bool) -> None:
        while True:
            if self._skip_space:
                stripped = self._buf.lstrip()
                if not stripped:
                    self._buf = ""
                    return
                self._buf = stripped
                self._skip_space = False
            if self._at_output_start:
                rest = self._buf.lstrip()
                verdict = self._opens_at_start(rest) if rest else None
                if verdict is None and not final:
                    return
                self._at_output_start = False
                if verdict:
                    self._buf = rest
                    self._in_region = True
            if self._in_region:
                decided = self._decide_region(self._buf, final)
                if decided is None:
                    return
                self._in_region = False
                if decided.calls is None:
                    self._text(out, self._buf[: decided.consumed])
                else:
                    for call in decided.calls:
                        self._call(out, call)
                    self._skip_space = True
                self._buf = self._buf[decided.consumed :]
                continue
            if not final and self._marker_starts.isdisjoint(self._buf):
                # No character that begins a marker: no marker and no start of one (what a token of
                # plain text nearly always is), so everything but trailing whitespace is text.
                ready = self._buf.rstrip()
                self._text(out, ready)
                self._buf = self._buf[len(ready) :]
                return
            found, marker = -1, ""
            for each in self._markers:
                at = self._buf.find(each)
                if at >= 0 and (found < 0 or at < found):
                    found, marker = at, each
            if found >= 0:
                self._text(out, self._buf[:found].rstrip())
                if marker in self.drop_markers:
                    self._buf = self._buf[found + len(marker) :]
                    self._skip_space = True
                else:
                    self._buf = self._buf[found:]
                    self._in_region = True
                continue
            if final:
                self._text(out, self._buf.rstrip() if self._calls else self._buf)
                self._buf = ""
                return
            keep = len(self._buf) - partial_suffix(self._buf, self._markers)
            ready = self._buf[:keep].rstrip()
            self._text(out, ready)
            self._buf = self._buf[len(ready) :]
            return


class TaggedToolParser(ToolParser):
    """A family whose calls sit between its start marker and ``end_marker``: a region is decided
    when the end marker arrives (an output that ends inside one is not a call); the family reads the
    calls in the body between the markers (:meth:`_calls_in`, None: not a valid call)."""

    end_marker: ClassVar[str]

    def _decide_region(self, region: str, final: bool) -> RegionResult | None:
        start = len(self.start_markers[0])
        at = region.find(self.end_marker, start)
        if at < 0:
            return RegionResult(len(region), None) if final else None
        return RegionResult(at + len(self.end_marker), self._calls_in(region[start:at]))

    @abstractmethod
    def _calls_in(self, body: str) -> tuple[ParsedCall, ...] | None:
        """The calls in one region's body, or None when it is not a valid call."""

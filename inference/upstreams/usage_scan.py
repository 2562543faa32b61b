"""The token usage of a relayed answer, read from its bytes without parsing the answer
(docs/DECISIONS.md D66): the counts that follow the answer's last ``"usage"`` object (or
``"meta_info"``, the native /generate answer's), by name, whatever the API's shape:

- OpenAI chat and completions: ``prompt_tokens``, ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``;
- the Responses API: ``input_tokens``, ``output_tokens`` and their ``*_details``;
- Anthropic Messages: ``input_tokens`` (the uncached part: the cache reads and writes are added to
  it), ``output_tokens``, ``cache_read_input_tokens``;
- SGLang's /generate: ``meta_info`` with ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``;
- Gemini's Interactions API: ``total_input_tokens``, ``total_output_tokens`` (the thoughts,
  ``total_thought_tokens``, outside it: added to the completion, and counted as reasoning),
  ``total_cached_tokens``.

A stream is scanned line by line as it passes (:class:`StreamUsage`); where the gateway asked the
worker for usage the client did not (``stream_options.include_usage``), the usage-only event the
worker adds is taken out of what the client receives, which is then byte for byte what the worker
would have sent without it. Counts reported several times in a stream (Anthropic's message_start and
message_delta, vLLM's continuous usage) are running totals: the highest of each is kept.
"""

from __future__ import annotations

import re

from inference.accounting import TokenUsage

__all__ = ["NullUsageStream", "StreamUsage", "usage_in_body", "usage_key"]

_COUNT = re.compile(
    rb'"(prompt_tokens|completion_tokens|cached_tokens|reasoning_tokens|input_tokens|output_tokens'
    rb'|cache_read_input_tokens|cache_creation_input_tokens)"\s*:\s*(\d+)'
)
# Gemini's Interactions names, tried only where none of the above is found (a longer alternation
# costs every usage event its extra branches).
_GEMINI_COUNT = re.compile(
    rb'"(total_input_tokens|total_output_tokens|total_cached_tokens|total_thought_tokens)"\s*:\s*(\d+)'
)
_USAGE = b'"usage"'
_META = b'"meta_info"'
_EMPTY_CHOICES = b'"choices":[]'


def usage_key(path: str) -> bytes:
    """The key whose object holds an answer's counts on ``path``."""
    return _META if path == "/generate" else _USAGE


_SLOT = {
    b"prompt_tokens": 0, b"input_tokens": 0, b"completion_tokens": 1, b"output_tokens": 1, b"cached_tokens": 2,
    b"reasoning_tokens": 3, b"cache_read_input_tokens": 4, b"cache_creation_input_tokens": 5,
    b"total_input_tokens": 0, b"total_output_tokens": 1, b"total_cached_tokens": 2, b"total_thought_tokens": 6,
}


def _counts(data: bytes, start: int, end: int, into: list[int]) -> bool:
    """The counts named in ``data[start:end]`` into ``into`` (prompt, completion, cached, reasoning),
    each the highest seen; whether there were any."""
    return _fold(_COUNT.findall(data, start, end) or _GEMINI_COUNT.findall(data, start, end), into)


def _fold(found: list[tuple[bytes, bytes]], into: list[int]) -> bool:
    """:func:`_counts` of the (name, count) pairs found."""
    if not found:
        return False
    seen = [-1, -1, -1, -1, 0, 0, 0]
    for name, value in found:
        slot = _SLOT[name]
        count = int(value)
        if count > seen[slot]:
            seen[slot] = count
    if seen[4] or seen[5]:  # Anthropic's cache reads and writes, outside its input_tokens
        if seen[0] >= 0:
            seen[0] += seen[4] + seen[5]
        seen[2] = max(seen[2], seen[4])
    if seen[6]:  # Gemini's thoughts, outside its total_output_tokens
        seen[1] = max(seen[1], 0) + seen[6]
        seen[3] = max(seen[3], seen[6])
    for i in range(4):
        if seen[i] > into[i]:
            into[i] = seen[i]
    return True


def _holds_object(data: bytes, after: int) -> bool:
    """Whether the key that ends at ``after`` is followed by an object (not ``null``)."""
    seen = data[after : after + 8].lstrip()
    return seen[:1] == b":" and seen[1:].lstrip()[:1] == b"{"


# The usual answer's usage (vLLM's, OpenAI's without details, SGLang's OpenAI routes), as their JSON
# writers put it (no spaces), within the last bytes of the answer. Every count's name, of both
# alternations above, ends with _NAME_END.
_USUAL = b'"usage":{"prompt_tokens":'
_USUAL_COMPLETION = b',"completion_tokens":'
_USUAL_TOTAL = b',"total_tokens":'
_USUAL_WINDOW = 256
_NAME_END = b'_tokens"'
_QUOTE = b'"'


def usage_in_body(body: bytes, key: bytes = _USAGE) -> TokenUsage | None:
    """The usage of a whole answer: the counts after its last ``key`` object; None when it has none.

    The usual answer is read by cutting its last bytes at the usual usage's fixed keys (D101): the
    prompt and completion counts are its digits between them, and what follows the total's key holds
    no other count's name nor another ``"usage"`` key (any quote at all, first). That is exactly the
    answer whose counts after its last usage key are that pair alone, which the general reading below
    takes the same way: four C calls where the regular expression's ``findall`` over the rest of the
    answer and its list of pairs cost twice as much. (``in`` is not used on bytes: for a bytes operand
    it first tries it as an integer and fails through a formatted exception.)"""
    if key is _USAGE:
        _, usual, tail = body[-_USUAL_WINDOW:].rpartition(_USUAL)
        if usual:
            prompt, _, rest = tail.partition(_USUAL_COMPLETION)
            completion, total, rest = rest.partition(_USUAL_TOTAL)
            if (
                total and prompt.isdigit() and completion.isdigit()
                and (rest.find(_QUOTE) < 0 or (rest.find(_NAME_END) < 0 and rest.find(_USAGE) < 0))
            ):  # fmt: skip
                return TokenUsage(int(prompt), int(completion))
    at = body.rfind(key)
    if at < 0 or not (body.startswith(b":{", at + len(key)) or _holds_object(body, at + len(key))):
        return None
    found = _COUNT.findall(body, at)
    if len(found) == 2:  # the usual answer (vLLM's, OpenAI's without details): what _counts makes of it
        (first, prompt), (second, completion) = found
        if first == b"prompt_tokens" and second == b"completion_tokens":
            return TokenUsage(int(prompt), int(completion))
    counts = [0, 0, 0, 0]
    if not _fold(found or _GEMINI_COUNT.findall(body, at), counts):
        return None
    return TokenUsage(*counts)


class StreamUsage:
    """Scans a relayed SSE stream for its usage as it passes. ``strip``: the gateway asked the worker
    for the usage-only event, which is taken out of what goes to the client; the stream is then passed
    on in whole lines only (a line split between two reads waits for its end, which a client could not
    have read before either)."""

    __slots__ = ("key", "strip", "counts", "found", "_tail", "_blank")

    def __init__(self, key: bytes = _USAGE, strip: bool = False) -> None:
        self.key = key
        self.strip = strip
        self.counts = [0, 0, 0, 0]
        self.found = False
        self._tail = b""
        self._blank = False  # a taken-out event's blank line is still to come

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` to send on (``chunk`` itself unless stripping)."""
        # From the tail: the key is in a stream's last events, and a reverse search of a chunk without
        # it costs about 60 % of ``in``'s instructions (1.65k against 2.78k for a 183-byte chat event).
        if chunk.rfind(self.key) < 0 and not self._tail and not self._blank and chunk.endswith(b"\n"):
            return chunk  # whole lines without a count: the usual chunk
        data = self._tail + chunk if self._tail else chunk
        if self._blank:
            if data == b"\r":  # the blank line's end is still to come
                self._tail = data
                return b""
            self._blank = False
            if data.startswith(b"\r\n"):
                data = data[2:]
            elif data.startswith(b"\n"):
                data = data[1:]
        cut = data.rfind(b"\n") + 1
        self._tail = data[cut:]
        key = self.key
        # The lines with the key, last first (a stream's usage is in its last events; a reverse search
        # costs less per byte): on each, its first key, as a reading from the start would take it.
        last = data.rfind(key, 0, cut)
        if last < 0:
            return data[:cut] if self.strip else chunk
        removed: list[tuple[int, int]] = []
        while last >= 0:
            start = data.rfind(b"\n", 0, last) + 1
            at = data.find(key, start, last + len(key))
            line_end = data.find(b"\n", last, cut)
            last = data.rfind(key, 0, start)
            if _holds_object(data, at + len(key)):
                self.found |= _counts(data, at, line_end, self.counts)
                if self.strip:
                    if data.find(_EMPTY_CHOICES, start, at) >= 0:  # the usage-only event: not the client's
                        end = line_end + 1
                        if data.startswith(b"\n", end):
                            end += 1
                        elif data.startswith(b"\r\n", end):
                            end += 2
                        elif end >= cut:
                            self._blank = True
                        removed.append((start, end))
        if not self.strip:
            return chunk
        if not removed:
            return data[:cut]
        kept = []
        position = 0
        for start, end in reversed(removed):
            kept.append(data[position:start])
            position = end
        kept.append(data[position:cut])
        return b"".join(kept)

    def end(self) -> bytes:
        """What is left at the stream's end (a last line without its newline)."""
        tail, self._tail = self._tail, b""
        if tail:
            at = tail.find(self.key)
            if at >= 0 and _holds_object(tail, at + len(self.key)):
                self.found |= _counts(tail, at, len(tail), self.counts)
        return tail if self.strip else b""

    def usage(self) -> TokenUsage | None:
        return TokenUsage(*self.counts) if self.found else None


_NULL_USAGE = b',"usage":null'


class NullUsageStream(StreamUsage):
    """A stream of OpenAI's API the gateway asked for usage: besides the usage-only event, asking
    adds ``"usage":null`` to every other chunk, which is taken out too (the client then receives the
    bytes OpenAI sends without the option). Engines (vLLM, SGLang) send the same chunks either way."""

    __slots__ = ()

    def feed(self, chunk: bytes) -> bytes:
        sent = StreamUsage.feed(self, chunk)
        return sent.replace(_NULL_USAGE, b"") if self.strip and _NULL_USAGE in sent else sent

    def end(self) -> bytes:
        rest = StreamUsage.end(self)
        return rest.replace(_NULL_USAGE, b"") if _NULL_USAGE in rest else rest

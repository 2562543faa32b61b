"""A runtime's GenerateResponse chunk read straight from its bytes (the event-loop reader's decode,
once per engine message), by one reader and a table of the runtime's field numbers.

SGLang, vLLM, TokenSpeed, MLX and TensorRT-LLM stream the same chunk (new token ids, packed; prompt,
completion and cached counts; the choice's index; SGLang also a reasoning count) under different
field numbers, and SGLang, TokenSpeed and TensorRT-LLM put the request's id before it. :func:`chunk_table` reads the numbers from
the runtime's own generated messages (so the table cannot drift from protos/), :func:`read_chunk`
reads a chunk of the usual shape with them and hands anything else to the runtime's protobuf parser
(upb), which reads or refuses it as it always did (D107, D110).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from google.protobuf.descriptor import FieldDescriptor

if TYPE_CHECKING:  # (client.py imports this module)
    from inference.upstreams.grpc.client import ChunkFields

__all__ = ["NO_FIELD", "ChunkTable", "chunk_reader", "chunk_table", "read_chunk"]

_VARINT, _LENGTH = 0, 2  # protobuf wire types
NO_FIELD = -1
"""The tag of a field the runtime's message lacks: no byte equals it."""


class ChunkTable(NamedTuple):
    """One runtime's tags (field number << 3 | wire type, each one byte) for :func:`read_chunk`, and
    its parser for everything else. ``id_tag`` and ``reasoning_tag`` are -1 where the runtime's
    message has no such field."""

    id_tag: int  # GenerateResponse.request_id (string)
    chunk_tag: int  # GenerateResponse.chunk (the message)
    ids_tag: int  # GenerateStreamChunk.token_ids (packed uint32)
    prompt_tag: int
    completion_tag: int
    cached_tag: int
    index_tag: int
    reasoning_tag: int
    parse: Callable[[bytes], Any]


def _tag(message: Any, name: str, wire_type: int, kind: int, *, optional: bool = False) -> int:
    field = message.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        if optional:
            return NO_FIELD
        raise LookupError(f"{message.DESCRIPTOR.full_name} has no field {name}")
    if field.type != kind or field.number >= 16:  # a one-byte tag of the expected type
        raise ValueError(f"{field.full_name}: type {field.type}, number {field.number}: not readable by read_chunk")
    return field.number << 3 | wire_type


def chunk_table(messages: ModuleType, *, index: str = "index") -> ChunkTable:
    """The table of the runtime whose generated module is ``messages`` (its GenerateResponse and
    GenerateStreamChunk; ``index`` names the chunk's choice index: TensorRT-LLM's
    ``sequence_index``); raises when its fields are not the shape :func:`read_chunk` reads."""
    response, chunk = messages.GenerateResponse, messages.GenerateStreamChunk
    ids = chunk.DESCRIPTOR.fields_by_name["token_ids"]
    if not ids.is_repeated or not ids.is_packed:
        raise ValueError(f"{ids.full_name}: not a packed repeated field")
    if response.DESCRIPTOR.fields_by_name["chunk"].message_type is not chunk.DESCRIPTOR:
        raise ValueError(f"{response.DESCRIPTOR.full_name}.chunk is not a {chunk.DESCRIPTOR.full_name}")
    uint32 = FieldDescriptor.TYPE_UINT32
    return ChunkTable(
        id_tag=_tag(response, "request_id", _LENGTH, FieldDescriptor.TYPE_STRING, optional=True),
        chunk_tag=_tag(response, "chunk", _LENGTH, FieldDescriptor.TYPE_MESSAGE),
        ids_tag=_tag(chunk, "token_ids", _LENGTH, uint32),
        prompt_tag=_tag(chunk, "prompt_tokens", _VARINT, uint32),
        completion_tag=_tag(chunk, "completion_tokens", _VARINT, uint32),
        cached_tag=_tag(chunk, "cached_tokens", _VARINT, uint32),
        index_tag=_tag(chunk, index, _VARINT, uint32),
        reasoning_tag=_tag(chunk, "reasoning_tokens", _VARINT, uint32, optional=True),
        parse=response.FromString,
    )


def read_chunk(table: ChunkTable, prefix: bytes, data: bytes) -> ChunkFields | Any:
    """One GenerateResponse off the wire: a chunk of the usual shape read straight from its bytes as
    its fields, in :class:`~inference.upstreams.grpc.client.WireChunk`'s order (the fields the
    runtime's ``_decode`` gives its chunk); anything else parsed by ``table.parse`` (upb) as before.
    A stream reads its messages with :func:`chunk_reader`'s function."""
    return chunk_reader(table, prefix)(data)


def chunk_reader(table: ChunkTable, prefix: bytes) -> Callable[[bytes], ChunkFields | Any]:
    """The decode of one stream's messages (made once per stream): each GenerateResponse's bytes
    to the chunk's fields, or to the message upb parses.

    The usual shape, as the runtimes' servicers send it while they decode: where the runtime has one,
    an ASCII ``request_id`` first, then one ``chunk`` to the end, holding only packed ``token_ids``
    and the counts and index (uint32 varints of at most 3 bytes: below 2**21), each length one byte.
    A logprob, hidden state, unknown field, repeated run, longer value or length, non-ASCII id or
    truncation goes to upb, which reads (or refuses) it as it always did. ``prefix`` is the id field
    the request's own id makes (empty where the runtime sends none), skipped without a copy.

    Reading the upb message's fields costs more than parsing it (about 13k instructions a chunk on
    CPython 3.11: an attribute lookup by name per field, the ids' container, ``WhichOneof`` and
    ``HasField``; the parse 3k); this reads the ~20 bytes of a chunk in about 11k, half the time.
    The table's tags are the closure's cells (no table unpacked, no ``functools.partial`` of a dozen
    arguments per message: both cost more than the constants of D107's SGLang-only reader)."""
    id_tag, chunk_tag, ids_tag, prompt_tag, completion_tag, cached_tag, index_tag, reasoning_tag, parse = table

    def read(data: bytes) -> ChunkFields | Any:
        try:
            if data.startswith(prefix):  # the request's own id, as the engine echoes it (or none: b"")
                at = len(prefix)
            elif data[0] == id_tag:  # another request_id
                length = data[1]
                if length >= 0x80 or not data[2 : 2 + length].isascii():
                    return parse(data)
                at = 2 + length
            else:
                at = 0
            size = len(data)
            length = data[at + 1]
            if data[at] != chunk_tag or length >= 0x80 or at + 2 + length != size:
                return parse(data)  # not one chunk to the end
            at += 2
            ids: tuple[int, ...] | None = None
            prompt = completion = cached = index = reasoning = 0
            if at < size and data[at] == ids_tag:  # the usual chunk's first field: one token id, read here (D115)
                length = data[at + 1]
                value = data[at + 2]
                if length == 3:  # an id of 2**14 or more (most of a large vocabulary)
                    second = data[at + 3]
                    third = data[at + 4]
                    if value >= 0x80 and second >= 0x80 and third < 0x80:
                        ids = ((value & 0x7F) | (second & 0x7F) << 7 | third << 14,)
                        at += 5
                elif length == 1:
                    if value < 0x80:
                        ids = (value,)
                        at += 3
                elif length == 2:
                    second = data[at + 3]
                    if value >= 0x80 and second < 0x80:
                        ids = ((value & 0x7F) | second << 7,)
                        at += 4
                # anything else (several ids, a longer value): the loop below reads it
            while at < size:
                tag = data[at]
                if tag == ids_tag:  # token_ids, packed
                    length = data[at + 1]
                    if ids is not None or length >= 0x80 or not length:
                        return parse(data)  # a second run (concatenated), a long or an empty one
                    at += 2
                    end = at + length
                    found: list[int] | None = None
                    while True:
                        value = data[at]
                        if value < 0x80:
                            at += 1
                        else:
                            second = data[at + 1]
                            if second < 0x80:
                                value = (value & 0x7F) | second << 7
                                at += 2
                            else:
                                third = data[at + 2]
                                if third >= 0x80:
                                    return parse(data)
                                value = (value & 0x7F) | (second & 0x7F) << 7 | third << 14
                                at += 3
                        if at >= end:
                            break
                        if found is None:
                            found = [value]
                        else:
                            found.append(value)
                    if at != end:
                        return parse(data)
                    if found is None:  # one token: the usual chunk while an engine decodes
                        ids = (value,)
                    else:
                        found.append(value)
                        ids = tuple(found)
                    continue
                value = data[at + 1]
                if value < 0x80:
                    at += 2
                else:
                    second = data[at + 2]
                    if second < 0x80:
                        value = (value & 0x7F) | second << 7
                        at += 3
                    else:
                        third = data[at + 3]
                        if third >= 0x80:
                            return parse(data)
                        value = (value & 0x7F) | (second & 0x7F) << 7 | third << 14
                        at += 4
                if tag == completion_tag:
                    completion = value
                elif tag == prompt_tag:
                    prompt = value
                elif tag == index_tag:
                    index = value
                elif tag == cached_tag:
                    cached = value
                elif tag == reasoning_tag:
                    reasoning = value
                else:  # logprobs, hidden states, an unknown field
                    return parse(data)
            if at != size:
                return parse(data)
        except IndexError:  # truncated: upb says how
            return parse(data)
        return (index, () if ids is None else ids, prompt, completion, cached, reasoning, None, None)

    return read

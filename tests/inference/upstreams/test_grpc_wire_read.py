"""SGLang's GenerateResponse read off the wire (inference/upstreams/grpc/sglang.py,
``read_generate_response``, D107): a chunk of the usual shape gives the fields ``_chunk_fields``
reads from the parsed message, anything else the parsed message itself, and what upb refuses is
refused the same way."""

from __future__ import annotations

import asyncio
import functools
import itertools
from typing import Any

import hpack
import pytest
from google.protobuf.message import DecodeError

from inference.upstreams.engine import EngineRequest
from inference.upstreams.grpc import SglangClient
from inference.upstreams.grpc.h2 import H2Connection
from inference.upstreams.grpc.sglang import read_generate_response
from protos import sglang_scheduler_pb2 as pb

REQUEST_ID = "chatcmpl-4f3c2a"
CLIENT = SglangClient("grpc://127.0.0.1:1")


def _reader(request_id: str = REQUEST_ID) -> Any:
    decode = CLIENT._wire_decode(EngineRequest(request_id=request_id, input_ids=(1,)))
    assert decode is not None
    return decode


def _chunk(request_id: str = REQUEST_ID, **fields: Any) -> bytes:
    return pb.GenerateResponse(request_id=request_id, chunk=pb.GenerateStreamChunk(**fields)).SerializeToString()


def _expected(data: bytes) -> Any:
    return CLIENT._chunk_fields(pb.GenerateResponse.FromString(data))


IDS = ([], [0], [127], [128], [16383], [16384], [151_000], [2**21 - 1], [5, 300, 151_643], list(range(1, 200_000, 8_001)))
COUNTS = (0, 1, 127, 128, 40_000, 2**21 - 1)


@pytest.mark.parametrize("ids", IDS)
def test_the_usual_chunk_is_read_as_its_fields(ids: list[int]) -> None:
    read = _reader()
    for prompt, completion, index in itertools.product(COUNTS, COUNTS, (0, 1, 3)):
        data = _chunk(token_ids=ids, prompt_tokens=prompt, completion_tokens=completion, index=index,
                      cached_tokens=completion // 2, reasoning_tokens=prompt // 3)  # fmt: skip
        fields = read(data)
        assert type(fields) is tuple
        assert fields == _expected(data)


@pytest.mark.parametrize("request_id", ["", "another-request", "x" * 127])
def test_another_or_no_request_id_is_read_too(request_id: str) -> None:
    data = _chunk(request_id, token_ids=[151_643], prompt_tokens=35, completion_tokens=9)
    fields = _reader()(data)
    assert type(fields) is tuple and fields == _expected(data)


def _parsed_as_upb(data: bytes) -> None:
    for read in (_reader(), functools.partial(read_generate_response, b"")):
        answer = read(data)
        assert isinstance(answer, pb.GenerateResponse)
        assert answer == pb.GenerateResponse.FromString(data)


def test_what_is_not_the_usual_chunk_is_parsed_by_upb() -> None:
    with_logprobs = pb.GenerateResponse(request_id=REQUEST_ID)
    with_logprobs.chunk.token_ids.extend([101])
    with_logprobs.chunk.output_logprobs.token_ids.extend([101])
    with_logprobs.chunk.output_logprobs.token_logprobs.extend([-0.5])
    with_prompt_logprobs = pb.GenerateResponse(request_id=REQUEST_ID)
    with_prompt_logprobs.chunk.token_ids.extend([101])
    with_prompt_logprobs.chunk.input_logprobs.token_ids.extend([1, 2])
    complete = pb.GenerateResponse(request_id=REQUEST_ID)
    complete.complete.output_ids.extend([1, 2])
    complete.complete.finish_reason = "stop"
    chunk_body = pb.GenerateStreamChunk(token_ids=[7], completion_tokens=3).SerializeToString()
    cases = [
        with_logprobs.SerializeToString(),
        with_prompt_logprobs.SerializeToString(),
        complete.SerializeToString(),
        pb.GenerateResponse(request_id=REQUEST_ID).SerializeToString(),  # no chunk
        b"",
        _chunk(token_ids=[7], hidden_states=[0.5]),
        _chunk(token_ids=[2**21]),  # a 4-byte varint
        _chunk(token_ids=[7], completion_tokens=2**32 - 1),
        _chunk("é-request", token_ids=[7]),  # not ASCII
        _chunk("r" * 200, token_ids=[7]),  # a two-byte length
        _chunk(token_ids=list(range(100, 200))),  # a run longer than 127 bytes
        # token ids not packed (field 1 as varints), two packed runs (concatenated), an unknown field
        b"\x12" + bytes((len(b"\x08\x07\x08\x09"),)) + b"\x08\x07\x08\x09",
        b"\x12\x08\x0a\x01\x07\x0a\x01\x09\x18\x02",
        b"\x12\x06\x0a\x01\x07\xf8\x01\x05",
        # the chunk twice (merged), the request id after the chunk, something after the chunk
        b"\x12\x02\x18\x01\x12\x02\x10\x05",
        b"\x12\x02\x18\x01\x0a\x01r",
        b"\x12" + bytes((len(chunk_body),)) + chunk_body + b"\x0a\x01r",
        # non-minimal varints upb accepts
        b"\x12\x05\x0a\x02\x87\x00\x18",
    ]
    for data in cases:
        try:
            expected = pb.GenerateResponse.FromString(data)
        except DecodeError:
            for read in (_reader(), functools.partial(read_generate_response, b"")):
                with pytest.raises(DecodeError):
                    read(data)
            continue
        answer = _reader()(data)
        if type(answer) is tuple:  # read by hand: must be what upb reads
            assert answer == CLIENT._chunk_fields(expected), data
        else:
            _parsed_as_upb(data)


def test_truncated_and_broken_messages_are_refused_as_upb_refuses_them() -> None:
    data = _chunk(token_ids=[151_643, 7], prompt_tokens=35, completion_tokens=300, index=1)
    read = _reader()
    for end in range(len(data)):
        piece = data[:end]
        try:
            expected = pb.GenerateResponse.FromString(piece)
        except DecodeError:
            with pytest.raises(DecodeError):
                read(piece)
            continue
        answer = read(piece)
        if type(answer) is tuple:
            assert answer == CLIENT._chunk_fields(expected)
        else:
            assert answer == expected
    for length in (0x85, 0x86, 0x87):  # a token id's varint running past its run's length
        broken = b"\x12\x04\x0a\x01" + bytes((length, 0x01))
        try:
            expected = pb.GenerateResponse.FromString(broken)
        except DecodeError:
            with pytest.raises(DecodeError):
                read(broken)
        else:
            answer = read(broken)
            assert (answer == CLIENT._chunk_fields(expected)) if type(answer) is tuple else answer == expected


def test_a_long_request_id_or_a_whole_answer_reads_with_the_replys_parser() -> None:
    assert CLIENT._wire_decode(EngineRequest(request_id="r" * 128, input_ids=(1,))) is None
    assert CLIENT._wire_decode(EngineRequest(request_id="r", input_ids=(1,), stream=False)) is None


class _Wire:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        pass


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


async def test_generate_reads_the_wire_fields_one_at_a_time_and_in_bursts() -> None:
    """The event-loop reader's messages read as fields (one message: one output; several that
    arrived together: one output of their tokens), then the complete, through generate()."""
    connection = H2Connection("engine:1")
    connection.connection_made(_Wire())  # type: ignore[arg-type]
    connection.data_received(_frame(4, 0, 0, (5).to_bytes(2, "big") + (16384).to_bytes(4, "big")))

    class Native:
        async def unary_stream(self, path: str, message: bytes, metadata: Any, decode: Any) -> Any:
            return connection.start(path, message, metadata, decode)

    client = SglangClient("grpc://127.0.0.1:1")
    client.channel.native = Native()  # type: ignore[assignment]
    outputs = client.generate(EngineRequest(request_id=REQUEST_ID, input_ids=(1, 2)))
    first = asyncio.ensure_future(anext(outputs))
    await asyncio.sleep(0)
    stream = 1
    encoder = hpack.Encoder()
    chunks = [_frame(0, 0, stream, _message(_chunk(token_ids=[151_000 + k], prompt_tokens=2, completion_tokens=k + 1)))
              for k in range(5)]  # fmt: skip
    connection.data_received(_frame(1, 4, stream, encoder.encode([(":status", "200")])) + chunks[0])
    one = await first
    assert (one.token_ids, one.completion_tokens, one.prompt_tokens) == ((151_000,), 1, 2)
    connection.data_received(b"".join(chunks[1:4]))  # three at once: folded into one output
    burst = await anext(outputs)
    assert (burst.token_ids, burst.completion_tokens) == ((151_001, 151_002, 151_003), 4)
    connection.data_received(chunks[4])
    assert (await anext(outputs)).token_ids == (151_004,)
    complete = pb.GenerateResponse(request_id=REQUEST_ID)
    complete.complete.output_ids.extend([151_004])
    complete.complete.finish_reason, complete.complete.prompt_tokens, complete.complete.completion_tokens = "stop", 2, 5
    connection.data_received(
        _frame(0, 0, stream, _message(complete.SerializeToString()))
        + _frame(1, 5, stream, encoder.encode([("grpc-status", "0")]))
    )
    last = await anext(outputs)
    assert last.finish is not None and last.token_ids == () and last.completion_tokens == 5
    with pytest.raises(StopAsyncIteration):
        await anext(outputs)

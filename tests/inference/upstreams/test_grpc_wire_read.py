"""SGLang's GenerateResponse read off the wire (inference/upstreams/grpc/sglang.py,
``read_generate_response``, D107): a chunk of the usual shape gives the fields ``_chunk_fields``
reads from the parsed message, anything else the parsed message itself, and what upb refuses is
refused the same way. The same for every runtime's table (inference/upstreams/grpc/wire.py, D110):
vLLM, TokenSpeed, MLX and TensorRT-LLM against protobuf's own encoding and their ``_decode``."""

from __future__ import annotations

import asyncio
import functools
import itertools
from typing import Any

import hpack
import pytest
from google.protobuf.message import DecodeError

from inference.upstreams.engine import EngineRequest
from inference.upstreams.grpc import MlxClient, SglangClient, TokenSpeedClient, TrtllmClient, VllmClient
from inference.upstreams.grpc.client import GrpcEngineClient, WireChunk
from inference.upstreams.grpc.h2 import H2Connection
from inference.upstreams.grpc.sglang import read_generate_response
from inference.upstreams.grpc.wire import NO_FIELD, chunk_table, read_chunk
from protos import common_pb2
from protos import sglang_scheduler_pb2 as pb
from protos import vllm_engine_pb2 as vpb

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


# -- every runtime's table (D110): one reader, the field numbers from each runtime's messages ------

RUNTIMES: dict[str, type[GrpcEngineClient[Any]]] = {
    "sglang": SglangClient, "vllm": VllmClient, "tokenspeed": TokenSpeedClient, "mlx": MlxClient,
    "trtllm": TrtllmClient,
}  # fmt: skip
INDEX = {"trtllm": "sequence_index"}


def _client(runtime: str) -> GrpcEngineClient[Any]:
    return RUNTIMES[runtime]("grpc://127.0.0.1:1")


def _runtime_reader(client: GrpcEngineClient[Any], request_id: str = REQUEST_ID) -> Any:
    decode = client._wire_decode(EngineRequest(request_id=request_id, input_ids=(1,)))
    assert decode is not None
    return decode


def _runtime_chunk(runtime: str, request_id: str | None = REQUEST_ID, **fields: Any) -> bytes:
    """The runtime's GenerateResponse of one chunk, as protobuf encodes it (``index`` under the
    runtime's name for it; the request id where the runtime has one)."""
    pb_module = RUNTIMES[runtime].messages
    if "index" in fields:
        fields[INDEX.get(runtime, "index")] = fields.pop("index")
    response = pb_module.GenerateResponse(chunk=pb_module.GenerateStreamChunk(**fields))
    if request_id is not None and "request_id" in pb_module.GenerateResponse.DESCRIPTOR.fields_by_name:
        response.request_id = request_id
    return response.SerializeToString()


def _same_as_protobuf(client: GrpcEngineClient[Any], read: Any, data: bytes) -> Any:
    """What ``read`` gives for ``data`` is what protobuf's parse and the runtime's ``_decode`` give:
    the same chunk when read by hand, the same message when parsed, the same refusal."""
    parse = client.messages.GenerateResponse.FromString
    try:
        expected = parse(data)
    except DecodeError:
        with pytest.raises(DecodeError):
            read(data)
        return None
    answer = read(data)
    if type(answer) is tuple:
        assert WireChunk(*answer) == client._decode(expected), data
    else:
        assert type(answer) is type(expected) and answer == expected, data
    return answer


def test_each_runtimes_table_is_its_messages_field_numbers() -> None:
    expected = {  # the engines' published field numbers: (request_id, chunk, index, reasoning_tokens)
        "sglang": (1, 2, 8, 9), "vllm": (None, 1, 7, None), "tokenspeed": (1, 2, 6, None), "mlx": (None, 1, 6, None),
        "trtllm": (1, 2, 2, None),
    }  # fmt: skip
    for runtime, (request_id, chunk, index, reasoning) in expected.items():
        table = RUNTIMES[runtime].wire_table
        assert table is not None
        assert table.id_tag == (NO_FIELD if request_id is None else request_id << 3 | 2)
        assert table.chunk_tag == chunk << 3 | 2
        assert table.index_tag == index << 3
        assert table.reasoning_tag == (NO_FIELD if reasoning is None else reasoning << 3)
        assert (table.ids_tag, table.prompt_tag, table.completion_tag, table.cached_tag) == (
            (0x0A, 0x10, 0x18, 0x20) if runtime != "trtllm" else (0x0A, 0x18, 0x20, 0x28)
        )
        assert table == chunk_table(RUNTIMES[runtime].messages, index=INDEX.get(runtime, "index"))


def test_a_message_of_another_shape_has_no_table() -> None:
    with pytest.raises(LookupError):
        chunk_table(RUNTIMES["trtllm"].messages)  # its index is sequence_index
    with pytest.raises(AttributeError):
        chunk_table(common_pb2)  # no GenerateResponse


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("ids", IDS)
def test_each_runtimes_usual_chunk_is_read_as_its_fields(runtime: str, ids: list[int]) -> None:
    client = _client(runtime)
    read = _runtime_reader(client)
    for prompt, completion, index in itertools.product(COUNTS, COUNTS, (0, 1, 3)):
        fields: dict[str, Any] = dict(token_ids=ids, prompt_tokens=prompt, completion_tokens=completion, index=index,
                                      cached_tokens=completion // 2)  # fmt: skip
        if runtime == "sglang":
            fields["reasoning_tokens"] = prompt // 3
        answer = _same_as_protobuf(client, read, _runtime_chunk(runtime, **fields))
        assert type(answer) is tuple


@pytest.mark.parametrize("runtime", ["sglang", "tokenspeed", "trtllm"])
@pytest.mark.parametrize("request_id", ["", "another-request", "x" * 127])
def test_another_or_no_request_id_is_read_for_each_runtime(runtime: str, request_id: str) -> None:
    client = _client(runtime)
    data = _runtime_chunk(runtime, request_id, token_ids=[151_643], prompt_tokens=35, completion_tokens=9)
    assert type(_same_as_protobuf(client, _runtime_reader(client), data)) is tuple


def _unusual(runtime: str) -> list[bytes]:
    """Messages of the runtime that are not the usual chunk, protobuf's own encoding where it can
    make them, bytes written out (with the runtime's tags) where it cannot."""
    client = _client(runtime)
    pb_module = client.messages
    table = client.wire_table
    assert table is not None
    chunk, complete = pb_module.GenerateStreamChunk, pb_module.GenerateResponse.DESCRIPTOR.fields_by_name["complete"]
    cases = []
    if runtime == "trtllm":
        with_logprobs = chunk(token_ids=[101], logprobs=[pb_module.TokenLogprob(token_id=101, logprob=-0.5)])
    else:
        with_logprobs = chunk(token_ids=[101])
        with_logprobs.output_logprobs.token_ids.extend([101])
        with_logprobs.output_logprobs.token_logprobs.extend([-0.5])
    cases.append(pb_module.GenerateResponse(chunk=with_logprobs).SerializeToString())
    if "input_logprobs" in chunk.DESCRIPTOR.fields_by_name:
        with_prompt_logprobs = chunk(token_ids=[101])
        with_prompt_logprobs.input_logprobs.token_ids.extend([1, 2])
        cases.append(pb_module.GenerateResponse(chunk=with_prompt_logprobs).SerializeToString())
    if "weight_version" in chunk.DESCRIPTOR.fields_by_name:  # TokenSpeed's
        cases.append(pb_module.GenerateResponse(chunk=chunk(token_ids=[7], weight_version="v2")).SerializeToString())
    finished = pb_module.GenerateResponse()
    getattr(finished, complete.name).finish_reason = "stop"
    cases.append(finished.SerializeToString())
    c = bytes((table.chunk_tag,))
    ids_run = bytes((table.ids_tag,))
    body = chunk(token_ids=[7], completion_tokens=3).SerializeToString()
    cases += [
        pb_module.GenerateResponse().SerializeToString(),  # nothing in it
        b"",
        _runtime_chunk(runtime, token_ids=[2**21]),  # a 4-byte varint
        _runtime_chunk(runtime, token_ids=[7], completion_tokens=2**32 - 1),
        _runtime_chunk(runtime, token_ids=list(range(100, 200))),  # a run longer than 127 bytes
        c + b"\x04\x08\x07\x08\x09",  # token ids not packed (field 1 as varints)
        c + b"\x08" + ids_run + b"\x01\x07" + ids_run + b"\x01\x09\x18\x02",  # two packed runs (concatenated)
        c + b"\x06" + ids_run + b"\x01\x07\xf8\x01\x05",  # an unknown field of a two-byte tag
        c + b"\x05" + ids_run + b"\x01\x07\x78\x05",  # an unknown field 15 (varint)
        c + b"\x06" + ids_run + b"\x01\x07\x7a\x01\x00",  # an unknown field 15 (bytes)
        c + b"\x02\x18\x01" + c + b"\x02\x10\x05",  # the chunk twice (merged)
        c + bytes((len(body),)) + body + b"\x78\x01",  # something after the chunk
        c + b"\x05" + ids_run + b"\x02\x87\x00\x18",  # a non-minimal varint, then a truncated field
        c + b"\x06" + ids_run + b"\x02\x87\x00\x10\x01",  # a non-minimal varint upb accepts
    ]
    # every other runtime's index and reasoning tags: unknown here unless the same
    for other in RUNTIMES.values():
        if other.wire_table is not None:
            for tag in (other.wire_table.index_tag, other.wire_table.reasoning_tag):
                if tag != NO_FIELD:
                    cases.append(c + b"\x05" + ids_run + b"\x01\x07" + bytes((tag, 3)))
    if table.id_tag != NO_FIELD:
        cases += [
            _runtime_chunk(runtime, "é-request", token_ids=[7]),  # not ASCII
            _runtime_chunk(runtime, "r" * 200, token_ids=[7]),  # a two-byte length
            c + b"\x02\x18\x01" + bytes((table.id_tag,)) + b"\x01r",  # the request id after the chunk
        ]
    return cases


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_what_is_not_each_runtimes_usual_chunk_is_parsed_by_protobuf(runtime: str) -> None:
    client = _client(runtime)
    table = client.wire_table
    assert table is not None
    for data in _unusual(runtime):
        _same_as_protobuf(client, _runtime_reader(client), data)
        _same_as_protobuf(client, functools.partial(read_chunk, table, b""), data)


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_each_runtimes_truncated_messages_are_refused_as_protobuf_refuses_them(runtime: str) -> None:
    client = _client(runtime)
    read = _runtime_reader(client)
    data = _runtime_chunk(runtime, token_ids=[151_643, 7], prompt_tokens=35, completion_tokens=300, index=1,
                          cached_tokens=20_000)  # fmt: skip
    for end in range(len(data) + 1):
        _same_as_protobuf(client, read, data[:end])
    table = client.wire_table
    assert table is not None
    for length in (0x85, 0x86, 0x87):  # a token id's varint running past its run's length
        _same_as_protobuf(client, read, bytes((table.chunk_tag,)) + b"\x04\x0a\x01" + bytes((length, 0x01)))


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_a_whole_answer_reads_with_the_replys_parser(runtime: str) -> None:
    client = _client(runtime)
    assert client._wire_decode(EngineRequest(request_id="r", input_ids=(1,), stream=False)) is None
    long_id = client._wire_decode(EngineRequest(request_id="r" * 128, input_ids=(1,)))
    assert (long_id is None) == (client.wire_table is not None and client.wire_table.id_tag != NO_FIELD)


async def test_vllm_generate_reads_the_wire_fields_one_at_a_time_and_in_bursts() -> None:
    """vLLM's chunks (no request id, each chunk's own count: accumulated) read off the wire as
    fields through generate(), one message and several that arrived together."""
    connection = H2Connection("engine:1")
    connection.connection_made(_Wire())  # type: ignore[arg-type]
    connection.data_received(_frame(4, 0, 0, (5).to_bytes(2, "big") + (16384).to_bytes(4, "big")))

    class Native:
        async def unary_stream(self, path: str, message: bytes, metadata: Any, decode: Any) -> Any:
            assert decode is not vpb.GenerateResponse.FromString  # the table's reader
            return connection.start(path, message, metadata, decode)

    client = VllmClient("grpc://127.0.0.1:1")
    client.channel.native = Native()  # type: ignore[assignment]
    outputs = client.generate(EngineRequest(request_id=REQUEST_ID, input_ids=(1, 2)))
    first = asyncio.ensure_future(anext(outputs))
    await asyncio.sleep(0)
    stream = 1
    encoder = hpack.Encoder()
    chunks = [_frame(0, 0, stream, _message(_runtime_chunk("vllm", token_ids=[151_000 + k], prompt_tokens=2,
                                                           completion_tokens=1)))
              for k in range(5)]  # fmt: skip
    connection.data_received(_frame(1, 4, stream, encoder.encode([(":status", "200")])) + chunks[0])
    one = await first
    assert (one.token_ids, one.completion_tokens, one.prompt_tokens) == ((151_000,), 1, 2)
    connection.data_received(b"".join(chunks[1:4]))
    burst = await anext(outputs)
    assert (burst.token_ids, burst.completion_tokens) == ((151_001, 151_002, 151_003), 4)
    connection.data_received(chunks[4])
    assert (await anext(outputs)).completion_tokens == 5
    complete = vpb.GenerateResponse()
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

"""vLLM's tensors on the ZMQ wire (``[dtype, shape, data]``, data inline as extension type 3 or an
aux-frame index) and its LogprobsLists / LogprobsTensors as neutral TokenLogprobs, built here
byte by byte as vLLM's MsgpackEncoder lays them out."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import pytest

from inference.upstreams.engine import TokenLogprobs
from inference.upstreams.zmq import codec
from inference.upstreams.zmq.logprobs import ChoiceLogprobs, prompt_logprobs, sample_logprobs
from inference.upstreams.zmq.tensors import TensorError, decode_array, inline_aux_frames

RAW_VIEW = 3  # vLLM's CUSTOM_TYPE_RAW_VIEW


def _lists(rows: list[list[tuple[int, float]]], *, ranks: list[int] | None = None, numpy: bool = True) -> list[Any]:
    """A LogprobsLists (numpy dtype.str) or LogprobsTensors (torch names) as msgpack would decode it:
    the raw views as bytes (what the codec's ext hook keeps)."""
    width = len(rows[0]) if rows else 0
    flat = [entry for row in rows for entry in row]
    names = ("<i4", "<f4", "<i8") if numpy else ("int32", "float32", "int64")
    return [
        [names[0], [len(rows), width], struct.pack(f"<{len(flat)}i", *(t for t, _ in flat))],
        [names[1], [len(rows), width], struct.pack(f"<{len(flat)}f", *(v for _, v in flat))],
        [names[2], [len(rows)], struct.pack(f"<{len(rows)}q", *(ranks or [1] * len(rows)))],
        None,
    ]


def test_numpy_and_torch_dtypes_and_byte_orders() -> None:
    assert decode_array(["<i4", [2], struct.pack("<2i", -3, 7)], "f").values == (-3, 7)
    assert decode_array([">i8", [1], struct.pack(">q", 2**40)], "f").values == (2**40,)
    assert decode_array(["int64", [1, 1], struct.pack("=q", 5)], "f").shape == (1, 1)
    assert decode_array(["<f2", [1], struct.pack("<e", 0.5)], "f").values == (0.5,)
    assert decode_array(["float32", [2], struct.pack("=2f", 0.25, -1.0)], "f").values == (0.25, -1.0)
    assert decode_array(["bfloat16", [2], struct.pack("=2H", 0x3F80, 0xC000)], "f").values == (1.0, -2.0)
    assert decode_array(["|b1", [2], b"\x01\x00"], "f").values == (True, False)
    assert decode_array(["<f4", [0, 3], b""], "f").rows() == []  # an empty chunk


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (["<c8", [1], b"\x00" * 8], "unsupported dtype"),
        (["<i4", [3], b"\x00" * 8], "8 bytes for shape [3]"),
        (["<i4", [-1], b""], "shape"),
        (["<i4", [1], 2], "aux frame 2"),
        (["<i4", [1], "text"], "neither inline bytes"),
        (["<i4", [1]], "expected [dtype, shape, data]"),
        ("float32", "expected [dtype, shape, data]"),
    ],
)
def test_a_malformed_array_is_a_tensor_error(wire: Any, message: str) -> None:
    with pytest.raises(TensorError, match=message.replace("[", r"\[")):
        decode_array(wire, "new_logprobs.logprobs")


def test_aux_frames_are_inlined_by_index() -> None:
    frames = [b"payload", struct.pack("<2i", 4, 5), struct.pack("<2f", -0.5, -1.5)]
    wire: list[Any] = [["<i4", [1, 2], 1], ["<f4", [1, 2], 2], ["<i8", [1], struct.pack("<q", 1)], None]
    inline_aux_frames(wire, frames)
    assert sample_logprobs(wire, [4], 1) == (TokenLogprobs(4, -0.5, ((5, -1.5),)),)
    single: list[Any] = ["<i4", [2], 1]
    inline_aux_frames(single, frames)
    assert decode_array(single, "f").values == (4, 5)
    missing: list[Any] = ["<i4", [2], 9]
    inline_aux_frames(missing, frames)  # out of range: left for the decoder to report
    with pytest.raises(TensorError, match="aux frame 9"):
        decode_array(missing, "f")


def test_the_codec_keeps_raw_views_for_the_decoder() -> None:
    wire = _lists([[(11, -0.25), (11, -0.25), (12, -2.0)]])
    for array in wire[:3]:
        array[2] = msgspec.msgpack.Ext(RAW_VIEW, array[2])
    payload = msgspec.msgpack.encode([0, [["r", [11], wire]]])
    output = codec.decode_outputs(payload).outputs[0]
    assert sample_logprobs(output.new_logprobs, output.new_token_ids, 2) == (
        TokenLogprobs(11, -0.25, ((11, -0.25), (12, -2.0))),
    )


def test_sample_logprobs_keep_the_alternatives_asked_for() -> None:
    wire = _lists([[(7, -0.5), (8, -0.25), (7, -0.5), (9, -3.0)], [(1, -1.0), (1, -1.0), (2, -2.0), (3, -4.0)]])
    assert sample_logprobs(wire, [7, 1], 2) == (
        TokenLogprobs(7, -0.5, ((8, -0.25), (7, -0.5))),
        TokenLogprobs(1, -1.0, ((1, -1.0), (2, -2.0))),
    )
    assert sample_logprobs(wire, [7, 1], 0) == (TokenLogprobs(7, -0.5), TokenLogprobs(1, -1.0))
    assert len(sample_logprobs(wire, [7, 1], 10)[0].top) == 3  # no more than the engine sent


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (_lists([[(7, -0.5)]])[:2], "expected"),
        ([*_lists([[(7, -0.5)]])[:3], [0, 1]], "cu_num_generated_tokens"),
        (_lists([[(7, -0.5)], [(8, -0.5)]]), "2 positions for 1 new tokens"),
        ([*_lists([[(7, -0.5)]])[:2], ["<i8", [2], struct.pack("<2q", 1, 1)], None], "ranks of shape"),
        ([["<f4", [1, 1], struct.pack("<f", 7.0)], *_lists([[(7, -0.5)]])[1:]], "float dtype"),
        ([["<i4", [1, 0], b""], ["<f4", [1, 0], b""], ["<i8", [1], struct.pack("<q", 1)], None], "without a token"),
    ],
)
def test_malformed_logprobs(wire: Any, message: str) -> None:
    with pytest.raises(TensorError, match=message):
        sample_logprobs(wire, [7], 1)


def test_prompt_logprobs_in_chunks() -> None:
    """Chunked prefill: two chunks (the first with no token), then the empty array once the prompt is
    done; None stands for the first prompt token, once."""
    choice = ChoiceLogprobs(top=1)
    first = codec.EngineCoreOutput("r", [], new_prompt_logprobs_tensors=_lists([[(5, -1.0), (6, -0.5)]], numpy=False))
    assert choice.take(first) is None
    second = codec.EngineCoreOutput(
        "r", [9], new_logprobs=_lists([[(9, -0.125), (9, -0.125)]]),
        new_prompt_logprobs_tensors=_lists([[(6, -2.0), (6, -2.0)]], numpy=False),
    )  # fmt: skip
    assert choice.take(second) == (TokenLogprobs(9, -0.125, ((9, -0.125),)),)
    assert choice.pop_prompt() == (None, TokenLogprobs(5, -1.0, ((6, -0.5),)), TokenLogprobs(6, -2.0, ((6, -2.0),)))
    done = codec.EngineCoreOutput("r", [], new_prompt_logprobs_tensors=_lists([], numpy=False))
    assert choice.take(done) is None and choice.pop_prompt() is None
    assert prompt_logprobs(_lists([[(5, -1.0)]]), 0, first_chunk=False) == (TokenLogprobs(5, -1.0),)

"""vLLM's ndarrays and tensors on the ZMQ wire, decoded without numpy.

vLLM's ``MsgpackEncoder`` (``vllm/v1/serial_utils.py``) sends a numpy array or a torch tensor as
the msgpack array ``[dtype, shape, data]``:

- ``dtype``: a numpy array's ``dtype.str`` (``"<i4"``, ``"<i8"``, ``"<f4"``: byte order, kind,
  item size) or a torch tensor's dtype name without ``torch.`` (``"int32"``, ``"float32"``,
  ``"bfloat16"``: the sender's native byte order, little-endian on every host vLLM runs on);
- ``shape``: the dimensions;
- ``data``: the C-order bytes inline as msgpack extension type 3 (``CUSTOM_TYPE_RAW_VIEW``; smaller
  than ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``, 256 bytes by default) or, for larger ones, an int:
  the index of the aux frame holding the bytes (frame 0 is the msgpack payload itself).

:func:`inline_aux_frames` swaps an aux-frame index for that frame's bytes (the reader task does it,
as the frames arrive); :func:`decode_array` checks dtype, shape and byte length and unpacks with
:mod:`struct`. Anything that does not fit is a :class:`TensorError`.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Array", "TensorError", "decode_array", "inline_aux_frames"]


class TensorError(ValueError):
    """A tensor on the wire that does not decode."""


@dataclass(frozen=True, slots=True)
class Array:
    """A decoded array: its shape and its values, flat in C order."""

    shape: tuple[int, ...]
    values: tuple[int | float, ...]

    def rows(self) -> list[tuple[int | float, ...]]:
        """A rank-2 array's rows."""
        if len(self.shape) != 2:
            raise TensorError(f"expected a rank-2 array, got shape {list(self.shape)}")
        count, width = self.shape
        return [self.values[i * width : (i + 1) * width] for i in range(count)]


# numpy kind + item size, and torch names → the struct format of one element.
_NUMPY = {
    "b1": "?", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q",
    "f2": "e", "f4": "f", "f8": "d",
}  # fmt: skip
_TORCH = {
    "bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
    "int64": "q", "uint64": "Q", "float16": "e", "float32": "f", "float64": "d", "bfloat16": "bf16",
}  # fmt: skip
_NATIVE = "<" if sys.byteorder == "little" else ">"


def _format(dtype: str) -> tuple[str, str]:
    """``(byte order, element format)`` of a numpy ``dtype.str`` or a torch dtype name."""
    if dtype in _TORCH:
        return _NATIVE, _TORCH[dtype]
    if len(dtype) >= 3 and dtype[0] in "<>|=" and dtype[1:] in _NUMPY:
        order = _NATIVE if dtype[0] in "|=" else dtype[0]
        return order, _NUMPY[dtype[1:]]
    raise TensorError(f"unsupported dtype {dtype!r}")


def inline_aux_frames(wire: Any, frames: Sequence[bytes]) -> None:
    """In place: each ``[dtype, shape, index]`` in ``wire`` (an array, or a list or tuple of them,
    one level deep as in LogprobsLists) takes the bytes of aux frame ``index`` when there is one.
    An index out of range stays an int (:func:`decode_array` reports it)."""
    if not isinstance(wire, list):
        return
    for item in (wire, *wire):
        if isinstance(item, list) and len(item) == 3 and isinstance(item[0], str):
            index = item[2]
            if isinstance(index, int) and not isinstance(index, bool) and 0 < index < len(frames):
                item[2] = frames[index]


def decode_array(wire: Any, field: str) -> Array:
    """``[dtype, shape, data]`` (data: the inline bytes, aux frames already inlined) as an
    :class:`Array`; :class:`TensorError` naming ``field`` when it does not decode."""
    if not isinstance(wire, (list, tuple)) or len(wire) != 3:
        raise TensorError(f"{field}: expected [dtype, shape, data], got {type(wire).__name__}")
    dtype, shape, data = wire
    if not isinstance(dtype, str):
        raise TensorError(f"{field}: the dtype is not a string")
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                       for d in shape):  # fmt: skip
        raise TensorError(f"{field}: the shape is not a list of dimensions")
    if isinstance(data, int) and not isinstance(data, bool):
        raise TensorError(f"{field}: aux frame {data} is not among the message's frames")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TensorError(f"{field}: the data is neither inline bytes nor an aux frame index")
    try:
        order, element = _format(dtype)
    except TensorError as exc:
        raise TensorError(f"{field}: {exc}") from None
    count = 1
    for dim in shape:
        count *= dim
    size = 2 if element == "bf16" else struct.calcsize(element)
    if len(data) != count * size:
        raise TensorError(f"{field}: {len(data)} bytes for shape {list(shape)} of {dtype} ({count * size} expected)")
    if element == "bf16":  # the upper half of a float32
        halves = struct.unpack(f"{order}{count}H", data)
        values: tuple[int | float, ...] = struct.unpack(f"{order}{count}f", struct.pack(f"{order}{count}I",
                                                                                     *(h << 16 for h in halves)))  # fmt: skip
    else:
        values = struct.unpack(f"{order}{count}{element}", data)
    return Array(tuple(shape), values)

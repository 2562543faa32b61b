"""A received header block that changed nothing in the HPACK decoder's table takes the fields it
decoded to before while the table has not changed (inference/upstreams/grpc/h2.py, D114): the same
bytes after an addition or a size update are decoded again, against the table as it is then."""

from __future__ import annotations

import pytest

from inference.upstreams.grpc.h2 import GrpcStatusError
from tests.inference.upstreams.test_grpc_h2_frames import DATA, HEADERS, Peer, frame, grpc_message, take_all

STATUS_200 = b"\x88"  # the static table's ":status: 200"
FIRST_DYNAMIC = b"\xbe"  # index 62: the dynamic table's newest entry


def added(name: bytes, value: bytes) -> bytes:
    """A literal field with incremental indexing and a new name: added to the table."""
    return b"\x40" + bytes((len(name),)) + name + bytes((len(value),)) + value


async def finish(peer: Peer, response_headers: bytes, trailers: bytes) -> list[bytes]:
    call = peer.call()
    peer.feed(
        frame(HEADERS, 0x4, call.stream_id, response_headers), frame(DATA, 0, call.stream_id, grpc_message(b"m")),
        frame(HEADERS, 0x5, call.stream_id, trailers),
    )  # fmt: skip
    return await take_all(call)


async def test_the_same_trailers_follow_the_table_as_it_changes() -> None:
    peer = Peer()
    # The response headers add grpc-status 0 to the table; the trailers are a reference to it.
    assert await finish(peer, STATUS_200 + added(b"grpc-status", b"0"), FIRST_DYNAMIC) == [b"m"]
    assert await finish(peer, STATUS_200, FIRST_DYNAMIC) == [b"m"]  # unchanged: the fields kept
    # An addition moves index 62 to grpc-status 3: the same trailer bytes now end the call with it.
    for response_headers in (STATUS_200 + added(b"grpc-status", b"3"), STATUS_200, STATUS_200):
        with pytest.raises(GrpcStatusError) as error:
            await finish(peer, response_headers, FIRST_DYNAMIC)
        assert error.value.name == "INVALID_ARGUMENT"


async def test_a_table_size_update_decodes_the_same_block_again() -> None:
    peer = Peer()
    assert await finish(peer, STATUS_200 + added(b"grpc-status", b"0"), FIRST_DYNAMIC) == [b"m"]
    assert await finish(peer, STATUS_200, FIRST_DYNAMIC) == [b"m"]
    call = peer.call()
    # A size update to 0 empties the table: index 62 names nothing, the block no longer decodes.
    peer.feed(frame(HEADERS, 0x4, call.stream_id, b"\x20" + STATUS_200), frame(HEADERS, 0x5, call.stream_id, FIRST_DYNAMIC))
    assert peer.connection.failed is not None and peer.wire.closed

"""The event-loop HTTP/2 reader frame by frame (inference/upstreams/grpc/h2.py): a peer played by the
test, its frames fed to the connection and what the connection writes back read, for what a real
grpcio server seldom does on loopback (padding, CONTINUATION, PING, GOAWAY, resets, bad frames)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack
import pytest

from inference.upstreams.grpc.h2 import GrpcStatus, GrpcStatusError, H2Call, H2Connection

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def grpc_message(body: bytes, compressed: bool = False) -> bytes:
    return bytes((1 if compressed else 0,)) + len(body).to_bytes(4, "big") + body


class Wire(asyncio.Transport):
    """What the connection writes, parsed back into frames."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        data = bytes(self.data)
        if data.startswith(PREFACE):
            data = data[len(PREFACE) :]
        found = []
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            found.append((data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9 : 9 + length]))
            data = data[9 + length :]
        return found


class Peer:
    """The server side: its HPACK encoder and the connection under test."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.wire = Wire()
        self.connection = H2Connection("engine:1", stream_window=1 << 16)
        self.connection.connection_made(self.wire)
        self.feed(frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 16384)))

    def feed(self, *frames: bytes) -> None:
        self.connection.data_received(b"".join(frames))

    def headers(self, fields: list[tuple[str, str]]) -> bytes:
        return self.encoder.encode(fields)

    def call(self) -> H2Call[bytes]:
        return self.connection.start("/svc/Generate", b"request", (("authorization", "Bearer k"),), bytes)


async def take_all(call: H2Call[bytes]) -> list[bytes]:
    return [message async for message in call]


async def test_settings_are_acknowledged_and_pings_answered() -> None:
    peer = Peer()
    assert peer.connection.settled.done()
    kinds = [(kind, flags) for kind, flags, _, _ in peer.wire.frames()]
    assert (SETTINGS, 0) in kinds and (SETTINGS, 1) in kinds and (WINDOW_UPDATE, 0) in kinds
    peer.feed(frame(PING, 0, 0, b"12345678"))
    assert peer.wire.frames()[-1] == (PING, 1, 0, b"12345678")


async def test_a_stream_with_padding_continuation_and_trailers() -> None:
    peer = Peer()
    call = peer.call()
    block = peer.headers([(":status", "200"), ("content-type", "application/grpc")])
    one, two = block[:2], block[2:]
    padded = bytes((3,)) + grpc_message(b"first") + grpc_message(b"sec")[:4] + b"\0\0\0"
    peer.feed(
        frame(HEADERS, 0, 1, one), frame(CONTINUATION, 0x4, 1, two),
        frame(DATA, 0x8, 1, padded), frame(DATA, 0, 1, grpc_message(b"sec")[4:]),
        frame(HEADERS, 0x5, 1, peer.headers([("grpc-status", "0")])),
    )  # fmt: skip
    assert await take_all(call) == [b"first", b"sec"]
    sent = [(kind, flags, stream) for kind, flags, stream, _ in peer.wire.frames()]
    assert (HEADERS, 0x4, 1) in sent and (DATA, 0x1, 1) in sent  # request headers, then the message with END_STREAM


async def test_a_trailers_only_error_and_a_percent_encoded_message() -> None:
    peer = Peer()
    call = peer.call()
    peer.feed(frame(HEADERS, 0x5, 1, peer.headers([(":status", "200"), ("grpc-status", "3"), ("grpc-message", "bad%20prompt")])))
    with pytest.raises(GrpcStatusError) as error:
        await take_all(call)
    assert (error.value.name, error.value.details) == ("INVALID_ARGUMENT", "bad prompt")


async def test_resets_goaway_and_a_lost_connection() -> None:
    peer = Peer()
    refused, first, third = peer.call(), peer.call(), peer.call()
    peer.feed(frame(RST_STREAM, 0, refused.stream_id, (7).to_bytes(4, "big")))  # REFUSED_STREAM: retryable
    with pytest.raises(GrpcStatusError) as error:
        await take_all(refused)
    assert error.value.code == GrpcStatus.UNAVAILABLE
    peer.feed(frame(GOAWAY, 0, 0, first.stream_id.to_bytes(4, "big") + (0).to_bytes(4, "big")))
    assert not peer.connection.usable and third.done and not first.done  # past the last id: failed at once
    peer.connection.connection_lost(None)
    with pytest.raises(GrpcStatusError) as lost:
        await take_all(first)
    assert lost.value.code == GrpcStatus.UNAVAILABLE


async def test_a_compressed_message_or_a_bad_header_block_ends_what_it_belongs_to() -> None:
    peer = Peer()
    call = peer.call()
    peer.feed(frame(HEADERS, 0x4, 1, peer.headers([(":status", "200")])), frame(DATA, 0, 1, grpc_message(b"x", compressed=True)))
    with pytest.raises(GrpcStatusError) as error:
        await take_all(call)
    assert error.value.code == GrpcStatus.INTERNAL
    assert peer.wire.frames()[-1][:3] == (RST_STREAM, 0, 1)
    other = peer.call()
    peer.feed(frame(HEADERS, 0x4, other.stream_id, b"\xff\xff\xff\xff"))  # not HPACK
    assert peer.connection.failed is not None and peer.wire.closed
    with pytest.raises(GrpcStatusError):
        await take_all(other)


async def test_a_request_waits_for_the_peers_window() -> None:
    peer = Peer()
    peer.feed(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 10)))  # a 10-byte stream window
    call = peer.connection.start("/svc/Generate", b"x" * 100, (), bytes)
    data = [payload for kind, _, stream, payload in peer.wire.frames() if kind == DATA and stream == call.stream_id]
    assert sum(len(p) for p in data) == 10
    peer.feed(frame(WINDOW_UPDATE, 0, call.stream_id, (1000).to_bytes(4, "big")))
    data = [(flags, payload) for kind, flags, stream, payload in peer.wire.frames() if kind == DATA and stream == call.stream_id]
    assert sum(len(p) for _, p in data) == 105 and data[-1][0] == 0x1


async def test_an_http_error_status_maps_to_its_grpc_status_and_an_oversized_frame_fails_the_connection() -> None:
    peer = Peer()
    unavailable, missing = peer.call(), peer.call()
    peer.feed(frame(HEADERS, 0x5, unavailable.stream_id, peer.headers([(":status", "503")])))
    peer.feed(frame(HEADERS, 0x5, missing.stream_id, peer.headers([(":status", "404")])))
    for call, code in ((unavailable, GrpcStatus.UNAVAILABLE), (missing, 12)):
        with pytest.raises(GrpcStatusError) as error:
            await take_all(call)
        assert error.value.code == code
    waiting = peer.call()
    peer.feed((16_385).to_bytes(3, "big") + bytes((DATA, 0)) + waiting.stream_id.to_bytes(4, "big"))
    assert peer.connection.failed is not None and peer.wire.frames()[-1][0] == GOAWAY
    with pytest.raises(GrpcStatusError):
        await take_all(waiting)

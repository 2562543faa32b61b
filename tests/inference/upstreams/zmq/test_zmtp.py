"""The data-plane sockets as ZMTP endpoints of the event loop (:mod:`inference.upstreams.zmq.zmtp`,
D95), against libzmq's own PUSH and DEALER (pyzmq), as an engine core dials in: single and multipart
messages, short and long frames, a frame larger than one read's buffer, several peers, heartbeats
answered, a peer of the wrong type refused, a dropped connection reported, closing; the ROUTER's
identities, refusal of an unknown one and handover."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from inference.upstreams.zmq import zmtp
from inference.upstreams.zmq.zmtp import PullServer, RouterServer


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmtp", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


class Sink:
    def __init__(self) -> None:
        self.messages: list[list[bytes]] = []
        self.lost = 0

    def message(self, frames: list[bytes]) -> None:
        self.messages.append(frames)

    def dropped(self) -> None:
        self.lost += 1


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def _pushing(
    context: zmq.asyncio.Context, path: Path, kind: int = zmq.PUSH, **options: int | bytes
) -> zmq.asyncio.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        socket.setsockopt(getattr(zmq, name), value)
    socket.connect(f"ipc://{path}")
    return socket


async def _served(path: Path, sink: Sink) -> PullServer:
    server = PullServer(str(path), sink.message, sink.dropped)
    server.start()
    return server


async def test_messages_of_every_size_and_shape_arrive_whole_and_in_order(ipc_dir: Path) -> None:
    sink, context = Sink(), zmq.asyncio.Context()
    path = ipc_dir / "out.sock"
    server = await _served(path, sink)
    try:
        push = await _pushing(context, path)
        big = bytes(range(256)) * 2048  # 512 KiB: a long frame, larger than one read's buffer
        sent: list[list[bytes]] = [
            [b"one"], [b""], [b"x" * 255], [b"y" * 256], [b"head", b"aux1", big], [big], [b"last"]
        ]  # fmt: skip
        for message in sent:
            await push.send_multipart(message)
        await _until(lambda: len(sink.messages) == len(sent))
        assert sink.messages == sent
        many = [[i.to_bytes(4, "big")] for i in range(2000)]  # many messages per read
        for message in many:
            await push.send_multipart(message)
        await _until(lambda: len(sink.messages) == len(sent) + len(many))
        assert sink.messages[len(sent) :] == many
        assert sink.lost == 0
    finally:
        server.close()
        context.destroy(linger=0)
    assert not path.exists()


async def test_several_peers_heartbeats_and_a_dropped_peer(ipc_dir: Path) -> None:
    sink, context = Sink(), zmq.asyncio.Context()
    path = ipc_dir / "out.sock"
    server = await _served(path, sink)
    try:
        # libzmq drops a connection that hears nothing within the heartbeat timeout: PINGs are answered.
        first = await _pushing(context, path, HEARTBEAT_IVL=20, HEARTBEAT_TIMEOUT=100)
        second = await _pushing(context, path)
        await first.send(b"a")
        await second.send(b"b")
        await _until(lambda: len(sink.messages) == 2)
        await asyncio.sleep(0.5)
        await first.send(b"c")
        await _until(lambda: len(sink.messages) == 3)
        assert sorted(m[0] for m in sink.messages) == [b"a", b"b", b"c"] and sink.lost == 0
        second.close(linger=0)  # an engine gone: its connection drops
        await _until(lambda: sink.lost == 1)
    finally:
        server.close()
        context.destroy(linger=0)
    assert sink.lost == 1  # closing the server reports no peer lost


async def test_a_peer_that_is_not_push_is_refused_and_not_reported_lost(ipc_dir: Path) -> None:
    sink, context = Sink(), zmq.asyncio.Context()
    path = ipc_dir / "out.sock"
    server = await _served(path, sink)
    try:
        dealer = await _pushing(context, path, zmq.DEALER)
        dealer.send(b"not for a PULL")
        await asyncio.sleep(0.3)
        assert sink.messages == [] and sink.lost == 0
    finally:
        server.close()
        context.destroy(linger=0)


async def test_closing_at_once_after_start_leaves_nothing_bound(ipc_dir: Path) -> None:
    path = ipc_dir / "out.sock"
    server = await _served(path, Sink())
    server.close()
    await asyncio.sleep(0.05)
    assert not path.exists()
    again = await _served(path, Sink())  # the path is free for the next one
    await asyncio.sleep(0.05)
    again.close()


async def test_the_router_receives_after_the_identity_sends_by_it_and_hands_an_identity_over(ipc_dir: Path) -> None:
    received: list[list[bytes]] = []
    context = zmq.asyncio.Context()
    path = ipc_dir / "in.sock"
    router = RouterServer(str(path), received.append)
    router.start()
    try:
        first = await _pushing(context, path, zmq.DEALER, ROUTING_ID=b"\x00\x00")  # engine 0's identity
        await first.send_multipart([b"ready", b"x" * 300])
        await _until(lambda: len(received) == 1)
        assert received == [[b"\x00\x00", b"ready", b"x" * 300]]
        assert router.send(b"\x00\x00", (b"\x00", b"add" * 200))
        assert await asyncio.wait_for(first.recv_multipart(), 5) == [b"\x00", b"add" * 200]
        assert not router.send(b"\x01\x00", (b"\x00", b"nobody"))  # not connected: refused (ROUTER_MANDATORY)
        # A restarted engine with the same identity takes it over; the old connection is closed.
        second = await _pushing(context, path, zmq.DEALER, ROUTING_ID=b"\x00\x00")
        await second.send(b"hello again")
        await _until(lambda: len(received) == 2)
        assert router.send(b"\x00\x00", (b"\x01", b"to the new one"))
        assert await asyncio.wait_for(second.recv_multipart(), 5) == [b"\x01", b"to the new one"]
        second.close(linger=0)
        await _until(lambda: not router.routes)
        assert not router.send(b"\x00\x00", (b"\x00", b"gone"))
    finally:
        router.close()
        context.destroy(linger=0)


async def test_a_message_larger_than_the_limit_drops_the_engine_without_holding_it(
    ipc_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame declaring more than MAX_MESSAGE_BYTES is not allocated: the connection is dropped and
    reported lost (its requests end), as is one whose multipart message grows past the limit."""
    monkeypatch.setattr(zmtp, "MAX_MESSAGE_BYTES", 1000)
    sink, context = Sink(), zmq.asyncio.Context()
    path = ipc_dir / "out.sock"
    server = await _served(path, sink)
    try:
        push = await _pushing(context, path)
        await push.send(b"fits")
        await _until(lambda: len(sink.messages) == 1)
        await push.send(b"z" * 1001)
        await _until(lambda: sink.lost == 1)
        again = await _pushing(context, path)
        await again.send_multipart([b"a" * 600, b"b" * 600, b"c"])
        await _until(lambda: sink.lost == 2)
        assert sink.messages == [[b"fits"]]
    finally:
        server.close()
        context.destroy(linger=0)

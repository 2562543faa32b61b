"""Bounded request receipt under uvicorn (administration/receipt.py): head size and header count,
the head deadline, body progress. A real uvicorn server on loopback with the gateway's protocol and
a small application; clients on raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from administration.receipt import BoundedHttpToolsProtocol, ReceiptLimits, bounded_protocol

LIMITS = ReceiptLimits(max_head_bytes=4096, max_headers=20, head_timeout_secs=0.5, body_timeout_secs=0.5,
                       min_body_rate=100)


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body and answers its length; notes a disconnect while reading."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            DISCONNECTS.append(scope["path"])
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = json.dumps({"received": size}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


DISCONNECTS: list[str] = []
ACCEPTED: list[int] = []  # the bytes each connection's protocol was handed, in connection order


def counting(limits: ReceiptLimits) -> type[BoundedHttpToolsProtocol]:
    """The gateway's protocol, counting what each connection read (nothing else changes)."""

    class Counting(bounded_protocol(limits)):  # type: ignore[misc]
        def connection_made(self, transport: Any) -> None:
            self._slot = len(ACCEPTED)
            ACCEPTED.append(0)
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            ACCEPTED[self._slot] += len(data)
            super().data_received(data)

    return Counting


@contextlib.asynccontextmanager
async def serving(protocol: type[BoundedHttpToolsProtocol], **options: Any) -> AsyncIterator[tuple[str, int]]:
    """uvicorn serving the echo application with ``protocol`` on a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(echo_app, http=protocol, loop="asyncio", lifespan="on",  # type: ignore[arg-type]
                            log_level="warning", access_log=False, **options)
    instance = uvicorn.Server(config)
    task = asyncio.ensure_future(instance.serve(sockets=[sock]))
    while not instance.started:
        await asyncio.sleep(0.01)
    yield sock.getsockname()[:2]
    instance.should_exit = True
    await asyncio.wait_for(task, 10)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int]]:
    DISCONNECTS.clear()
    ACCEPTED.clear()
    async with serving(counting(LIMITS)) as address:
        yield address


async def exchange(address: tuple[str, int], *parts: bytes, pause: float = 0.0, wait: float = 5.0) -> bytes:
    """Send ``parts`` (``pause`` seconds apart) until the server answers; return all it sent before
    closing."""
    reader, writer = await asyncio.open_connection(*address)
    answer = asyncio.ensure_future(reader.read())
    try:
        for index, part in enumerate(parts):
            if index and pause:
                await asyncio.wait([answer], timeout=pause)
            if answer.done() or reader.at_eof() or reader._buffer:  # it answered: stop sending
                break
            try:
                writer.write(part)
                await writer.drain()
            except ConnectionError:
                break
        return await asyncio.wait_for(answer, wait)
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def envelope(answer: bytes) -> dict[str, Any]:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


async def test_an_ordinary_request_is_answered_and_the_connection_kept(server: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*server)
    for _ in range(3):
        writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert status_of(head) == 200
        await reader.readexactly(len(b'{"received": 5}'))
    writer.close()


async def test_a_head_past_its_size_gets_431_and_a_close(server: tuple[str, int]) -> None:
    answer = await exchange(server, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
    assert status_of(answer) == 431
    assert envelope(answer)["error"]["code"] == "request_header_fields_too_large"
    assert b"connection: close" in answer


def _send_endless_header(address: tuple[str, int]) -> tuple[int, bytes]:
    """A blocking client sending a 64 MiB header line (unless the server closes first); what it
    sent, and what it received. Raw sockets: what the server wrote before its close (and reset) is
    still read."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        piece = b"a" * 65536
        sent = 0
        try:
            for _ in range(1024):
                sock.sendall(piece)
                sent += len(piece)
        except OSError:  # reset or broken pipe: the server closed
            pass
        received = b""
        try:
            while data := sock.recv(65536):
                received += data
        except OSError:
            pass
    return sent, received


async def test_a_header_line_that_never_ends_is_refused_as_it_arrives(server: tuple[str, int]) -> None:
    """Issue 22, item 4: a 64 MiB header line gets its 431 once the head passes the limit, not once
    the line ends: the server read no more than the limit, 1 KiB of request line, and one read."""
    sent, got = await asyncio.to_thread(_send_endless_header, server)
    assert status_of(got) == 431 and envelope(got)["error"]["code"] == "request_header_fields_too_large"
    one_read = 256 * 1024  # asyncio's and uvloop's largest socket read
    assert ACCEPTED[-1] <= LIMITS.max_head_bytes + 1024 + one_read
    assert sent < 64 * 2**20


async def test_pipelined_heads_near_the_limit_are_each_judged_alone(server: tuple[str, int]) -> None:
    """A read holding one request and the start of the next does not count the first toward the
    second's head."""
    one = b"POST /a HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 3500 + b"\r\nContent-Length: 5\r\n\r\nhello"
    reader, writer = await asyncio.open_connection(*server)
    writer.write(one + one[:2000])
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert status_of(head) == 200
    await reader.readexactly(len(b'{"received": 5}'))
    writer.write(one[2000:] + one)
    for _ in range(2):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert status_of(head) == 200
        await reader.readexactly(len(b'{"received": 5}'))
    writer.close()


async def test_a_long_target_counts_toward_the_head(server: tuple[str, int]) -> None:
    answer = await exchange(server, b"GET /" + b"p" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 431


async def test_too_many_headers_get_431(server: tuple[str, int]) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % index for index in range(25))
    answer = await exchange(server, b"GET / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert status_of(answer) == 431


async def test_a_head_sent_in_many_small_parts_is_counted_whole(server: tuple[str, int]) -> None:
    parts = [b"GET / HTTP/1.1\r\nHost: x\r\n"] + [b"X-Part: " + b"b" * 300 + b"\r\n" for _ in range(15)]
    answer = await exchange(server, *parts, b"\r\n")
    assert status_of(answer) == 431


async def test_headers_within_the_limits_pass(server: tuple[str, int]) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (index, b"v" * 100) for index in range(18))
    answer = await exchange(server, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n")
    assert status_of(answer) == 200


async def test_a_connection_that_sends_nothing_is_closed(server: tuple[str, int]) -> None:
    answer = await exchange(server)
    assert answer == b""  # closed without an answer: no request began


async def test_a_head_that_stops_midway_gets_408_and_a_close(server: tuple[str, int]) -> None:
    answer = await exchange(server, b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert status_of(answer) == 408
    assert envelope(answer)["error"] == {
        "message": "The request head did not arrive within 0.5 seconds", "type": "timeout_error", "param": None,
        "code": "request_timeout",
    }


async def test_a_head_trickled_byte_by_byte_still_meets_its_deadline(server: tuple[str, int]) -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 40
    answer = await exchange(server, *[head[i:i + 1] for i in range(len(head))], pause=0.05)
    assert status_of(answer) == 408


async def test_a_body_that_stops_gets_408_and_the_application_sees_a_disconnect(server: tuple[str, int]) -> None:
    answer = await exchange(server, b"POST /stalled HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", b"0123456789")
    assert status_of(answer) == 408
    assert envelope(answer)["error"]["message"] == "The request body did not arrive within 0.5 seconds"
    await asyncio.sleep(0.05)
    assert DISCONNECTS == ["/stalled"]


async def test_a_body_trickled_below_the_minimum_rate_gets_408(server: tuple[str, int]) -> None:
    # A byte every 0.2 s: no gap reaches the 0.5 s timeout, but 5 bytes/s is far below 100.
    parts = [b"POST /trickle HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n"] + [b"x"] * 40
    answer = await exchange(server, *parts, pause=0.2, wait=10)
    assert status_of(answer) == 408


async def test_a_body_arriving_steadily_is_read_whole(server: tuple[str, int]) -> None:
    # 30 parts of 50 bytes, 0.1 s apart: 500 bytes/s, above the minimum rate, no long gap.
    parts = [b"POST /steady HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1500\r\n\r\n"]
    parts += [b"y" * 50] * 30
    answer = await exchange(server, *parts, pause=0.1, wait=10)
    assert status_of(answer) == 200
    assert envelope(answer) == {"received": 1500}


async def test_an_idle_keep_alive_connection_between_requests_is_not_a_slow_head(server: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*server)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)) == 200
    await reader.readexactly(len(b'{"received": 0}'))
    await asyncio.sleep(1.0)  # twice the head timeout, idle between requests (the keep-alive timer's)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(await asyncio.wait_for(reader.read(), 5)) == 200
    writer.close()


def test_limits_come_from_the_flags() -> None:
    from common.config import GatewayConfig

    config = GatewayConfig(max_request_head_bytes=1000, max_request_headers=7, request_head_timeout_secs=2.5,
                           request_body_timeout_secs=4.0, min_request_body_rate=0)
    assert ReceiptLimits.of(config) == ReceiptLimits(1000, 7, 2.5, 4.0, 0)
    defaults = ReceiptLimits.of(GatewayConfig())
    assert (defaults.max_head_bytes, defaults.max_headers, defaults.head_timeout_secs) == (65536, 100, 30.0)


@pytest.fixture
async def short_keep_alive() -> AsyncIterator[tuple[str, int]]:
    """The gateway's protocol with a keep-alive of 0.4 s."""
    async with serving(bounded_protocol(LIMITS), timeout_keep_alive=0.4) as address:
        yield address


async def test_the_keep_alive_clock_is_one_timer_counted_from_the_last_answer(short_keep_alive: tuple[str, int]) -> None:
    """Requests in a row keep one keep-alive timer (uvicorn armed and cancelled one per request: D86);
    a connection answering requests 0.25 s apart for longer than the keep-alive stays open (the time
    counts from each answer) and is closed once idle for the keep-alive."""
    reader, writer = await asyncio.open_connection(*short_keep_alive)

    async def one() -> None:
        writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert status_of(head) == 200
        await reader.readexactly(len(b'{"received": 5}'))

    await one()
    [protocol] = _connections()
    held = []  # the timers themselves, so no two share an id
    for _ in range(10):
        await one()
        held.append(protocol.timeout_keep_alive_task)
    assert len({id(timer) for timer in held}) == 1
    for _ in range(4):  # 1 s of requests 0.25 s apart, past the 0.4 s keep-alive
        await asyncio.sleep(0.25)
        await one()
    assert await asyncio.wait_for(reader.read(), 3) == b""  # idle past 0.4 s: closed by the server
    writer.close()


def _connections() -> list[Any]:
    import gc

    return [obj for obj in gc.get_objects() if isinstance(obj, BoundedHttpToolsProtocol) and obj.transport is not None
            and not obj.transport.is_closing()]  # fmt: skip

"""A request the HTTP relay wrote on a kept-alive connection the worker had closed is sent once more
on a new connection (spec 3's gw_router_upstream_send_retries_total: one resend when the first send
fails before any response), so a worker that closes an idle connection just as the next request goes
out (or restarted since) answers it; nothing else is sent twice. Over HTTP/2 the same holds for a
stream the worker says it did not process (a GOAWAY that excludes it, REFUSED_STREAM).

The stand-in worker follows a script per connection it accepts: for each request on it, answer, hang
up (FIN) or reset (RST) without answering, or send part of an answer's head and hang up. A script's
last step closes the connection exactly when the next request arrived on it, the race the resend
covers, made deterministic."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import hpack
import pytest

from common import telemetry as metrics
from inference.auth import ANONYMOUS
from inference.routing.workers import WorkerHandle, WorkerLoad
from inference.upstreams.base import RelayRequest
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.http import HttpRelay
from tests.conftest import record_for

ANSWER = b'{"id":"x","object":"chat.completion","choices":[]}'
BODY = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'


class ScriptedWorker:
    """Answers as ``scripts`` say: one list per accepted connection (in order; past the last, each
    new connection answers everything), one step per request on it (past its last step: answer)."""

    def __init__(self, scripts: list[list[str]]) -> None:
        self.scripts = scripts
        self.accepted = 0
        self.requests = 0
        self.url = ""
        self.handlers: set[asyncio.Task[None]] = set()

    async def done(self) -> None:
        """Wait for the connections' handlers to see their connection closed."""
        if self.handlers:
            await asyncio.wait(self.handlers, timeout=5)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        script = self.scripts[self.accepted] if self.accepted < len(self.scripts) else []
        self.accepted += 1
        try:
            for step in [*script, *["answer"] * 100]:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                self.requests += 1
                if step == "answer":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
                    await writer.drain()
                    continue
                if step == "reset":  # SO_LINGER 0: the close sends RST
                    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif step == "partial":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
                    await writer.drain()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def scripted(*scripts: list[str]) -> AsyncIterator[tuple[ScriptedWorker, HttpRelay, WorkerHandle]]:
    worker = ScriptedWorker(list(scripts))
    server = await asyncio.start_server(worker.handle, "127.0.0.1", 0)
    worker.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    relay = HttpRelay(30.0)
    try:
        yield worker, relay, WorkerHandle(record_for(worker.url, model="m"), WorkerLoad())
    finally:
        await relay.close()
        await worker.done()
        server.close()


async def chat(relay: HttpRelay, handle: WorkerHandle) -> bytes:
    """One whole chat through the relay, its body read to the end (the connection back in the pool)."""
    answer = await relay.open(RelayRequest(handle, "/v1/chat/completions", BODY, False, b"rid", (), ANONYMOUS))
    assert answer.status == 200
    return b"".join([chunk async for chunk in answer.chunks()])


def resends() -> float:
    return metrics.REGISTRY.get_sample_value("gw_router_upstream_send_retries_total", {"router_type": "http"}) or 0.0


@pytest.mark.parametrize("closing", ["hangup", "reset"])
async def test_a_request_on_a_kept_alive_connection_the_worker_closed_is_sent_again_on_a_new_one(closing: str) -> None:
    """The worker answers the first request and closes the connection (FIN, or RST) as the second
    arrives on it: the second is answered on a new connection, counted as one resend."""
    async with scripted(["answer", closing]) as (worker, relay, handle):
        before = resends()
        assert await chat(relay, handle) == ANSWER
        assert await chat(relay, handle) == ANSWER
        assert (worker.accepted, worker.requests) == (2, 3)
        assert resends() - before == 1
        assert await chat(relay, handle) == ANSWER  # the new connection is pooled and reused
        assert worker.accepted == 2


async def test_a_new_connection_the_worker_closes_unanswered_is_not_sent_again() -> None:
    """A connection opened for the request and closed by the worker without an answer is the worker's
    failure (another worker, or 502), not a stale connection: nothing is sent twice."""
    async with scripted(["hangup"]) as (worker, relay, handle):
        before = resends()
        with pytest.raises(UpstreamFailure) as failed:
            await chat(relay, handle)
        assert failed.value.kind is FailureKind.BROKEN
        assert (worker.accepted, worker.requests) == (1, 1)
        assert resends() == before


async def test_the_resend_is_made_once() -> None:
    """The new connection closed unanswered too: the request fails as any broken exchange does."""
    async with scripted(["answer", "hangup"], ["hangup"]) as (worker, relay, handle):
        before = resends()
        assert await chat(relay, handle) == ANSWER
        with pytest.raises(UpstreamFailure):
            await chat(relay, handle)
        assert (worker.accepted, worker.requests) == (2, 3)
        assert resends() - before == 1


async def test_a_worker_that_began_answering_is_not_sent_the_request_again() -> None:
    """Part of an answer's head came back before the worker hung up: it had the request, which is
    not sent twice."""
    async with scripted(["answer", "partial"]) as (worker, relay, handle):
        before = resends()
        assert await chat(relay, handle) == ANSWER
        with pytest.raises(UpstreamFailure):
            await chat(relay, handle)
        assert (worker.accepted, worker.requests) == (1, 2)
        assert resends() == before


async def test_a_connection_closed_before_the_request_went_out_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new connection that is closed before the request is written (the worker closing it at once)
    carried nothing: the request goes out once on another."""
    import aiohttp

    original = aiohttp.TCPConnector.connect
    opened: list[object] = []

    async def closed_at_once(self: aiohttp.TCPConnector, *args: object, **kwargs: object) -> object:
        conn = await original(self, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(conn)
        if len(opened) == 1:
            conn.transport.close()  # type: ignore[union-attr]
            while conn.transport is not None:  # its connection_lost has run
                await asyncio.sleep(0)
        return conn

    monkeypatch.setattr(aiohttp.TCPConnector, "connect", closed_at_once)
    async with scripted() as (worker, relay, handle):
        before = resends()
        assert await chat(relay, handle) == ANSWER
        assert (len(opened), worker.requests) == (2, 1)
        assert resends() - before == 1


# -- HTTP/2 ---------------------------------------------------------------------------------------

_FRAME = struct.Struct(">IBI")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _FRAME.pack(len(payload) << 8 | kind, flags, stream_id) + payload


class ScriptedH2Worker(ScriptedWorker):
    """An h2c worker answering as ``scripts`` say, per stream: answer, ``goaway`` (GOAWAY excluding
    the stream, then close) or ``refuse`` (RST_STREAM REFUSED_STREAM)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        script = self.scripts[self.accepted] if self.accepted < len(self.scripts) else []
        self.accepted += 1
        steps = iter([*script, *["answer"] * 100])
        encoder = hpack.Encoder()
        try:
            await reader.readexactly(24)  # the client preface
            writer.write(_frame(4, 0, 0))  # SETTINGS
            while True:
                head = await reader.readexactly(9)
                size_kind, flags, stream_id = _FRAME.unpack(head)
                await reader.readexactly(size_kind >> 8)
                kind = size_kind & 0xFF
                if kind == 4 and not flags & 1:
                    writer.write(_frame(4, 1, 0))  # SETTINGS ACK
                if kind not in (0, 1) or not flags & 1:  # a request ends with END_STREAM (HEADERS or DATA)
                    continue
                self.requests += 1
                step = next(steps)
                if step == "goaway":
                    writer.write(_frame(7, 0, 0, struct.pack(">II", max(0, stream_id - 2), 0)))
                    await writer.drain()
                    return
                if step == "refuse":
                    writer.write(_frame(3, 0, stream_id, struct.pack(">I", 7)))
                    continue
                block = encoder.encode([(":status", "200"), ("content-type", "application/json"),
                                        ("content-length", str(len(ANSWER)))])  # fmt: skip
                writer.write(_frame(1, 4, stream_id, block) + _frame(0, 1, stream_id, ANSWER))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def scripted_h2(*scripts: list[str]) -> AsyncIterator[tuple[ScriptedWorker, HttpRelay, WorkerHandle]]:
    worker = ScriptedH2Worker(list(scripts))
    server = await asyncio.start_server(worker.handle, "127.0.0.1", 0)
    worker.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    relay = HttpRelay(30.0)
    try:
        yield worker, relay, WorkerHandle(dataclasses.replace(record_for(worker.url, model="m"), http2=True), WorkerLoad())
    finally:
        await relay.close()
        await worker.done()
        server.close()


async def test_a_stream_a_goaway_excluded_is_sent_again_on_a_new_connection() -> None:
    async with scripted_h2(["answer", "goaway"]) as (worker, relay, handle):
        before = resends()
        assert await chat(relay, handle) == ANSWER
        assert await chat(relay, handle) == ANSWER
        assert (worker.accepted, worker.requests) == (2, 3)
        assert resends() - before == 1


async def test_a_refused_stream_is_sent_again() -> None:
    async with scripted_h2(["refuse"]) as (worker, relay, handle):
        before = resends()
        assert await chat(relay, handle) == ANSWER
        assert (worker.accepted, worker.requests) == (1, 2)  # the connection was not going away
        assert resends() - before == 1


async def test_a_refused_stream_is_sent_again_once() -> None:
    async with scripted_h2(["goaway"], ["goaway"]) as (worker, relay, handle):
        before = resends()
        with pytest.raises(UpstreamFailure):
            await chat(relay, handle)
        assert (worker.accepted, worker.requests) == (2, 2)
        assert resends() - before == 1

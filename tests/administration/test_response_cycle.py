"""administration/response_cycle.py: uvicorn's cycle writing the same bytes in fewer writes, and telling
a disconnect watch that the client left without a task. Each case is run through uvicorn's own
:class:`RequestResponseCycle` and :class:`LeanCycle` on recording transports and compared."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from administration.response_cycle import LeanCycle
from inference.asgi_io import DisconnectWatch


class Recording:
    """A transport that keeps what is written, one entry per write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def cycle_of(kind: type[RequestResponseCycle], method: str = "POST", keep_alive: bool = True) -> Any:
    transport = Recording()
    scope = {"type": "http", "method": method, "http_version": "1.1", "path": "/v1/chat/completions",
             "query_string": b"", "headers": []}  # fmt: skip
    return kind(
        scope=scope, transport=transport, flow=FlowControl(transport), logger=logging.getLogger("t"),  # type: ignore[arg-type]
        access_logger=logging.getLogger("t.access"), access_log=False,
        default_headers=[(b"date", b"Sat, 28 Nov 2026 08:00:00 GMT")], message_event=asyncio.Event(),
        expect_100_continue=False, keep_alive=keep_alive, on_response=lambda: None,
    )  # fmt: skip


async def run(kind: type[RequestResponseCycle], messages: list[dict[str, Any]], **options: Any) -> tuple[list[bytes], str]:
    cycle = cycle_of(kind, **options)
    error = ""
    try:
        for message in messages:
            await cycle.send(message)
    except RuntimeError as exc:
        error = str(exc)
    return cycle.transport.writes, error


def start(status: int = 200, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


JSON = (b"content-type", b"application/json")
CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "whole": ([start(200, (b"x-request-id", b"req-1"), (b"content-length", b"2"), JSON), body(b"{}")], {}),
    "whole in parts": ([start(200, (b"Content-Length", b"6")), body(b"ab", True), body(b"cd", True), body(b"ef")], {}),
    "stream": ([start(200, (b"content-type", b"text/event-stream")), body(b"data: 1\n\n", True), body(b"")], {}),
    "chunked declared": ([start(200, (b"transfer-encoding", b"chunked")), body(b"x", True), body(b"")], {}),
    "empty length": ([start(200, (b"content-length", b"0")), body(b"")], {}),
    "204": ([start(204), body(b"")], {}),
    "HEAD": ([start(200, (b"content-length", b"5")), body(b"")], {"method": "HEAD"}),
    "connection close": ([start(200, (b"connection", b"Close"), (b"content-length", b"1")), body(b"x")], {}),
    "not kept alive": ([start(200, (b"content-length", b"1")), body(b"x")], {"keep_alive": False}),
    "longer than declared": ([start(200, (b"content-length", b"1")), body(b"xy")], {}),
    "shorter than declared": ([start(200, (b"content-length", b"3")), body(b"xy")], {}),
    "bad name": ([start(200, (b"bad name", b"v"), (b"x-v", b"a\nb"))], {}),
    "bad value first": ([start(200, (b"x-v", b"a\rb"), (b"bad:name", b"v"))], {}),
    "tab in a value": ([start(200, (b"x-v", b"a\tb"), (b"content-length", b"1")), body(b"x")], {}),
    "large body": ([start(200, (b"content-length", b"%d" % 70_000)), body(b"z" * 70_000)], {}),
    "body before start": ([body(b"x")], {}),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_same_bytes_and_errors_as_uvicorn(case: str) -> None:
    messages, options = CASES[case]
    theirs, their_error = await run(RequestResponseCycle, messages, **options)
    ours, our_error = await run(LeanCycle, messages, **options)
    assert b"".join(ours) == b"".join(theirs)
    assert our_error == their_error


async def test_a_whole_response_goes_out_in_one_write() -> None:
    messages = CASES["whole"][0]
    theirs, _ = await run(RequestResponseCycle, messages)
    ours, _ = await run(LeanCycle, messages)
    assert len(theirs) == 2
    assert len(ours) == 1


async def test_a_stream_head_goes_out_before_its_first_chunk() -> None:
    cycle = cycle_of(LeanCycle)
    await cycle.send(start(200, (b"content-type", b"text/event-stream")))
    assert len(cycle.transport.writes) == 1 and cycle.transport.writes[0].startswith(b"HTTP/1.1 200 OK")


async def test_the_watch_is_told_when_the_client_leaves_without_a_task() -> None:
    cycle = cycle_of(LeanCycle)
    tasks_before = len(asyncio.all_tasks())

    async def relaying() -> None:
        await asyncio.sleep(3600)

    async def handler() -> bool:
        watch = DisconnectWatch(cycle.receive)
        assert len(asyncio.all_tasks()) == tasks_before + 1  # the handler's own task, no watcher
        try:
            await relaying()
        except asyncio.CancelledError:
            return watch.fired
        finally:
            watch.stop()
        return False

    task = asyncio.ensure_future(handler())
    await asyncio.sleep(0)
    cycle.disconnected = True  # as the protocol does on connection_lost, then tells the cycle
    cycle.client_left()
    assert await task is True


async def test_a_stopped_watch_is_not_told() -> None:
    cycle = cycle_of(LeanCycle)
    told: list[bool] = []
    assert cycle.watch_disconnect(lambda: told.append(True))
    assert not cycle.watch_disconnect(lambda: told.append(False))  # one watch at a time
    cycle.unwatch_disconnect()
    cycle.disconnected = True
    cycle.client_left()
    assert told == []
    assert not cycle.watch_disconnect(lambda: None)  # already gone: the watch falls back to receive

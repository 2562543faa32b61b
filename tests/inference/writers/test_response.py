"""The response writer: gateway headers at response start, the surface's framing at the end of a
stream (never a second closing event, none for a surface whose events close themselves), the
in-band error, the stream observer, and the disconnect watch stopped before the final message."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from inference import errors
from inference.writers import OPENAI_SSE, Framing, ResponseClock, ResponseWriter

# A surface whose events close themselves (Anthropic messages): no sentinel, its own error event.
SELF_CLOSING = Framing("self-closing", b"", b"", lambda error: b"event: error\ndata: {}\n\n")


class Sent(list):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self if m["type"] == "http.response.body")

    @property
    def head(self) -> dict[bytes, bytes]:
        return dict(self[0]["headers"])


class Observer:
    def __init__(self) -> None:
        self.first: list[float] = []
        self.ended: list[tuple[float, float, int]] = []

    def first_chunk(self, at: float) -> None:
        self.first.append(at)

    def stream_ended(self, first_at: float, ended_at: float, events: int) -> None:
        self.ended.append((first_at, ended_at, events))


def writer(sent: Sent, framing: Framing = OPENAI_SSE) -> ResponseWriter:
    clock = ResponseClock(0.0)
    clock.headers = ((b"x-ratelimit-limit", b"5"),)
    return ResponseWriter(sent, b"rid-1", clock, framing)


async def test_a_whole_body_carries_the_gateway_headers() -> None:
    sent = Sent()
    await writer(sent).whole(201, b"application/json", b'{"ok":1}')
    assert sent[0]["status"] == 201
    head = sent.head
    assert head[b"x-request-id"] == b"rid-1" and head[b"content-length"] == b"8"
    assert head[b"content-type"] == b"application/json" and head[b"x-ratelimit-limit"] == b"5"
    assert float(head[b"x-gw-overhead-ms"]) >= 0
    assert sent[-1] == {"type": "http.response.body", "body": b'{"ok":1}'}


async def test_an_openai_stream_without_done_gets_one() -> None:
    sent = Sent()
    out = writer(sent)
    await out.open_stream()
    await out.chunk(b'data: {"a":1}\n\n')
    await out.chunk(b'data: {"a":2}\n\n', last=True)
    assert sent.head[b"content-type"] == b"text/event-stream" and sent.head[b"x-accel-buffering"] == b"no"
    assert sent.body.endswith(b'data: {"a":2}\n\ndata: [DONE]\n\n')
    assert sent.body.count(b"[DONE]") == 1 and "more_body" not in sent[-1]


async def test_a_done_split_over_chunks_is_not_sent_twice() -> None:
    sent = Sent()
    out = writer(sent)
    await out.open_stream()
    await out.chunk(b'data: {"a":1}\n\ndata: [DO')
    await out.chunk(b"NE]\n\n")
    await out.end_stream()
    assert sent.body.count(b"[DONE]") == 1 and sent[-1]["body"] == b""


async def test_done_inside_generated_text_does_not_close_the_stream() -> None:
    sent = Sent()
    out = writer(sent)
    await out.open_stream()
    await out.chunk(b'data: {"text":"[DONE]"}\n\n', last=True)
    assert sent.body.endswith(b'"}\n\ndata: [DONE]\n\n')


async def test_a_self_closing_surface_gets_no_done() -> None:
    sent = Sent()
    out = writer(sent, SELF_CLOSING)
    await out.open_stream()
    await out.chunk(b"event: message_start\ndata: {}\n\n")
    await out.chunk(b"event: message_stop\ndata: {}\n\n", last=True)
    assert b"[DONE]" not in sent.body and sent.body.endswith(b"event: message_stop\ndata: {}\n\n")


async def test_a_broken_stream_reports_in_band_in_the_surface_framing() -> None:
    sent = Sent()
    out = writer(sent)
    await out.open_stream()
    await out.chunk(b'data: {"a":1}\n\n')
    await out.error(errors.stream_failed("ServerDisconnectedError"))
    *_, event, final = sent
    assert orjson.loads(event["body"][6:]) == {
        "error": {"message": "Worker stream failed: ServerDisconnectedError", "type": "internal_error"}
    }
    assert final == {"type": "http.response.body", "body": b"data: [DONE]\n\n"}

    other = Sent()
    out = writer(other, SELF_CLOSING)
    await out.open_stream()
    await out.break_stream(errors.stream_failed("x"))
    assert other.body == b"event: error\ndata: {}\n\n"


async def test_an_error_before_the_start_is_the_json_envelope() -> None:
    sent = Sent()
    await writer(sent).error(errors.model_not_found("m"))
    assert sent[0]["status"] == 404 and sent.head[b"x-gw-error-code"] == b"model_not_found"
    assert sent.head[b"x-request-id"] == b"rid-1"
    assert orjson.loads(sent.body)["error"]["code"] == "model_not_found"


async def test_the_observer_sees_the_first_chunk_once_and_the_event_count() -> None:
    sent = Sent()
    out = writer(sent)
    observer = out.observer = Observer()
    await out.open_stream()
    await out.chunk(b"data: 1\n\ndata: 2\n\n")
    await out.chunk(b"data: 3\n\n")
    await out.end_stream()
    assert len(observer.first) == 1
    [(first_at, ended_at, events)] = observer.ended
    assert first_at == observer.first[0] <= ended_at and events == 3


async def test_the_disconnect_watch_stops_before_the_final_message() -> None:
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await never.wait()
        return {"type": "http.disconnect"}

    stopped_at: list[int] = []
    sent = Sent()
    out = writer(sent)
    watch = out.watch(receive)

    async def send(message: dict[str, Any]) -> None:
        if watch._task is None and not stopped_at:
            stopped_at.append(len(sent))
        await sent(message)

    out._send = send
    await out.open_stream()
    await out.chunk(b"data: 1\n\n")
    assert not stopped_at
    await out.chunk(b"data: 2\n\n", last=True)
    assert stopped_at == [2]  # stopped right before the third (final) message went out


async def test_an_event_is_a_chunk_without_a_coroutine() -> None:
    """event() (a surface's per-token chunk, D106) writes what chunk() writes: the observer's first
    chunk and event count, the tail the stream's end reads (one [DONE])."""
    sent, by_chunk = Sent(), Sent()
    out, reference = writer(sent), writer(by_chunk)
    observer = out.observer = Observer()
    for target in (out, reference):
        await target.open_stream()
    for event in (b'data: {"choices":[{"delta":{"content":"a longer piece"}}]}\n\n', b'data: {"content":"' + b"." * 40 + b'"}\n\n'):
        await out.event(event)
        await reference.chunk(event)
        assert out._tail == reference._tail
    await out.end_stream()
    await reference.end_stream()
    assert sent.body == by_chunk.body and sent.body.count(b"[DONE]") == 1
    assert [m.get("more_body") for m in sent] == [m.get("more_body") for m in by_chunk]
    assert len(observer.first) == 1 and observer.ended[0][2] == 2

"""A worker on loopback that frames its answers the way the test asks, written on a raw asyncio
server so nothing normalises them: ``close`` (no Content-Length, no chunked coding: the body ends
when the connection closes, as HTTP/1.0 servers and some proxies answer), ``chunked``, or ``length``.

It answers what an OpenAI-compatible worker would: POST /v1/chat/completions (a whole completion,
or server-sent events when the request asks to stream), POST /v1/responses (a provider's Responses
events), GET /v1/models, GET /health and GET /get_load. ``endless`` makes every body go on until the peer closes
(the server writes as fast as the peer reads, never faster: it awaits ``drain``); ``cut`` makes it
close halfway through a POST's answer. Every request arrives on its own connection when the framing is
``close``; it counts connections and the body bytes it wrote, and ``peer_closed`` is set when a
peer hung up on an endless body.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal

import orjson

__all__ = ["FramedWorker", "framed_worker", "CHAT_ANSWER", "STREAM_EVENTS", "RESPONSES_EVENTS"]

Framing = Literal["close", "chunked", "length"]

CHAT_ANSWER = orjson.dumps({
    "id": "chatcmpl-framed", "object": "chat.completion", "created": 1, "model": "framed-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "framed hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
})  # fmt: skip


def _chunk_event(content: str, finish: str | None = None) -> bytes:
    delta = {"content": content} if content else {}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    payload = {"id": "chatcmpl-framed", "object": "chat.completion.chunk", "created": 1, "model": "framed-model",
               "choices": [choice]}  # fmt: skip
    return b"data: " + orjson.dumps(payload) + b"\n\n"


STREAM_EVENTS = [_chunk_event("framed"), _chunk_event(" hello"), _chunk_event("", "stop"), b"data: [DONE]\n\n"]


def _responses_events() -> list[bytes]:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "framed hello", "annotations": []}]}  # fmt: skip
    response = {"id": "resp_up", "object": "response", "status": "completed", "model": "framed-model",
                "output": [item], "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}  # fmt: skip
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "framed"},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": " hello"},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return [b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n" for event in events]


RESPONSES_EVENTS = _responses_events()


@dataclass
class FramedWorker:
    url: str
    framing: Framing
    version: bytes = b"HTTP/1.1"
    endless: bool = False
    cut: bool = False
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)  # request lines, in order
    body_bytes_written: int = 0
    peer_closed: asyncio.Event = field(default_factory=asyncio.Event)


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """The request line and body (Content-Length framed, as the gateway sends), or None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.split(b"\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    try:
        body = await reader.readexactly(length) if length else b""
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return lines[0], body


def _answer_of(line: bytes, body: bytes) -> tuple[bytes, list[bytes]]:
    """The content type and body parts for a request."""
    if line.startswith(b"POST /v1/responses"):
        return b"text/event-stream", RESPONSES_EVENTS
    if line.startswith(b"POST /v1/chat/completions") and orjson.loads(body).get("stream") is True:
        return b"text/event-stream", STREAM_EVENTS
    if line.startswith(b"GET /get_load"):
        return b"application/json", [b'{"num_reqs": 3, ', b'"num_waiting_reqs": 1}']
    if line.startswith(b"GET /v1/models"):
        return b"application/json", [b'{"object": "list", "data": [{"id": "framed-model", ', b'"owned_by": "vllm"}]}']
    if line.startswith(b"GET /health"):
        return b"application/json", [b'{"status": ', b'"ok"}']
    return b"application/json", [CHAT_ANSWER[: len(CHAT_ANSWER) // 2], CHAT_ANSWER[len(CHAT_ANSWER) // 2 :]]


async def _serve(worker: FramedWorker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    worker.connections += 1
    try:
        while (request := await _read_request(reader)) is not None:
            line, body = request
            worker.requests.append(line)
            content_type, parts = _answer_of(line, body)
            if worker.endless:
                parts = [b" " * 65536]
            head = [worker.version + b" 200 OK", b"Content-Type: " + content_type]
            if worker.framing == "chunked":
                head.append(b"Transfer-Encoding: chunked")
            elif worker.framing == "length":
                head.append(b"Content-Length: %d" % sum(map(len, parts)))
            if worker.framing == "close":
                head.append(b"Connection: close")
            writer.write(b"\r\n".join(head) + b"\r\n\r\n")
            cut = worker.cut and line.startswith(b"POST ")
            if cut:
                parts = [parts[0][: max(1, len(parts[0]) // 2)]]
            while True:
                for part in parts:
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part) if worker.framing == "chunked" else part)
                    worker.body_bytes_written += len(part)
                    await writer.drain()
                if not worker.endless:
                    break
            if cut or worker.framing == "close":
                break
            if worker.framing == "chunked":
                writer.write(b"0\r\n\r\n")
                await writer.drain()
    except ConnectionError:
        if worker.endless:
            worker.peer_closed.set()
    finally:
        writer.close()


@asynccontextmanager
async def framed_worker(
    framing: Framing, *, version: bytes = b"HTTP/1.1", endless: bool = False, cut: bool = False
) -> AsyncIterator[FramedWorker]:
    worker = FramedWorker("", framing, version, endless, cut)
    handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers[task] = writer
        try:
            await _serve(worker, reader, writer)
        finally:
            handlers.pop(task, None)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    worker.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield worker
    finally:
        server.close()
        # A connection the gateway keeps alive (its idle pool) still has its handler waiting for the
        # next request: closing it ends the handler (its read sees the end) here, in this loop, not
        # when the task is collected after the loop closed. Not cancelled: Python 3.11's stream
        # callback then logs the handler's CancelledError as an exception.
        for writer in list(handlers.values()):
            writer.close()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()

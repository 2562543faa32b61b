"""A control-plane body is refused at DATA_UPLOAD_MAX_MEMORY_SIZE while it arrives, not after Django
spooled all of it: a larger Content-Length is 413 before a byte of the body is read, and a body that
announces no length (chunked) is 413 once it passes the limit, the rest never read. Through the whole
ASGI app, with a receive that counts what the gateway took from the connection."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from django.conf import settings

from gateway_project.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

CHUNK = 64 * 1024
PATH = "/parse/reasoning"  # a control-plane route (Django's)


class Connection:
    """A client's request body as a server hands it over, in CHUNK messages, counting what is read."""

    def __init__(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.body = body
        self.headers = headers
        self.read = 0
        self.sent: list[dict[str, Any]] = []
        self.done = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.read < len(self.body):
            chunk = self.body[self.read:self.read + CHUNK]
            self.read += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": self.read < len(self.body)}
        await self.done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Any) -> None:
        self.sent.append(dict(message))
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.done.set()

    async def post(self) -> tuple[int, dict[bytes, bytes], Any]:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": PATH, "raw_path": PATH.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"gateway"), (b"content-type", b"application/json"), *self.headers],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
        }
        await asyncio.wait_for(application(scope, self.receive, self.send), 60)
        self.done.set()
        start = next(message for message in self.sent if message["type"] == "http.response.start")
        body = b"".join(message.get("body", b"") for message in self.sent if message["type"] == "http.response.body")
        return int(start["status"]), dict(start["headers"]), orjson.loads(body)


def oversized(limit: int) -> bytes:
    return b'{"text": "' + b"x" * (4 * limit) + b'", "reasoning_parser": "qwen3"}'


async def test_a_chunked_body_is_refused_once_it_passes_the_limit() -> None:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    connection = Connection(oversized(limit), [(b"transfer-encoding", b"chunked")])
    status, headers, body = await connection.post()
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    assert headers[b"x-gw-error-code"] == b"payload_too_large"
    assert limit < connection.read <= limit + CHUNK  # stopped reading at the limit, of a body four times it


async def test_a_too_large_content_length_is_refused_before_the_body_is_read() -> None:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    body = oversized(limit)
    connection = Connection(body, [(b"content-length", str(len(body)).encode())])
    status, _headers, answer = await connection.post()
    assert status == 413 and answer["error"]["code"] == "payload_too_large"
    assert connection.read == 0


async def test_a_body_within_the_limit_reaches_django_whole() -> None:
    body = orjson.dumps({"text": "<think>a</think>" + "b" * (3 * CHUNK), "reasoning_parser": "qwen3"})
    connection = Connection(body, [(b"transfer-encoding", b"chunked")])
    status, _headers, answer = await connection.post()
    assert status == 200, answer
    assert connection.read == len(body) and answer["success"] is True

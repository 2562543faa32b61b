"""One HTTP request to an ASGI app, as a server would hand it over: any method, path (percent-decoded,
NUL and all), query bytes, raw header bytes and body, none of it normalised the way an HTTP client
library would. After the body, ``receive`` waits until the response is complete, then reports a
disconnect (what a server does for a client that stays)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson

from inference.asgi_io import ASGIApp

__all__ = ["Answer", "call_asgi"]


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    messages: list[dict[str, Any]] = field(default_factory=list)

    def json(self) -> Any:
        return orjson.loads(self.body)


async def call_asgi(
    app: ASGIApp,
    method: str,
    path: str,
    *,
    query: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
    timeout: float = 30.0,
) -> Answer:
    sent: list[dict[str, Any]] = []
    done = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode("utf-8", "surrogatepass"), "query_string": query, "root_path": "",
        "headers": [(b"host", b"gateway"), *(headers or [])], "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout)
    done.set()
    start = next(message for message in sent if message["type"] == "http.response.start")
    return Answer(
        status=int(start["status"]),
        headers={bytes(key).lower(): bytes(value) for key, value in start.get("headers") or ()},
        body=b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body"),
        messages=sent,
    )

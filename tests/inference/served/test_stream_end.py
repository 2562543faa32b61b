"""A served stream's end (D112): the last step's chunk, the usage chunk and ``[DONE]`` go out as one
final body message, the same bytes as before in the same order; without usage, the finish chunk and
``[DONE]``; chat and completions."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from tests.inference.served.conftest import QWEN_MODEL, Start


async def _stream(asgi_app: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    data = httpx.Request("POST", "http://gateway", json=body).content
    pending = [{"type": "http.request", "body": data, "more_body": False}]
    done = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
    }  # fmt: skip
    await asyncio.wait_for(asgi_app(scope, receive, send), 10)
    done.set()
    return [message for message in sent if message["type"] == "http.response.body"]


def _events(raw: bytes) -> list[str]:
    return [event[6:] for event in raw.decode().split("\n\n") if event.startswith("data: ")]


@pytest.mark.parametrize("usage", [True, False])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_the_stream_ends_in_one_body_message(
    start_engine_gateway: Start, asgi_app: Any, path: str, usage: bool
) -> None:
    await start_engine_gateway(chunk_tokens=1)
    body: dict[str, Any] = {"model": QWEN_MODEL, "stream": True, "max_tokens": 6}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    if usage:
        body["stream_options"] = {"include_usage": True}
    bodies = await _stream(asgi_app, path, body)
    assert all(message.get("more_body") for message in bodies[:-1])
    assert not bodies[-1].get("more_body")
    last = _events(bodies[-1]["body"])
    assert last[-1] == "[DONE]"
    finish = orjson.loads(last[0])
    assert finish["choices"][0]["finish_reason"] is not None
    if usage:
        assert len(last) == 3
        assert finish.get("usage") is None and orjson.loads(last[1])["choices"] == []
        assert orjson.loads(last[1])["usage"]["completion_tokens"] > 0
    else:
        assert len(last) == 2
    # Every earlier message holds whole events, none of them the finish.
    for message in bodies[:-1]:
        assert message["body"].endswith(b"\n\n")
        for event in _events(message["body"]):
            assert all(choice["finish_reason"] is None for choice in orjson.loads(event)["choices"])

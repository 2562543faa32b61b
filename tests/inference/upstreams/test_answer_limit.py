"""--max-buffered-response-bytes: a non-streamed worker answer is held whole up to the limit; a
worker that declares or sends more fails the attempt with the 502 envelope (or the request moves to
another worker) and its connection is closed; streamed answers are not held, so no limit applies."""

from __future__ import annotations

from typing import AsyncIterator

import pytest
from aiohttp import web

from tests.conftest import GatewayFactory, record_for

LIMIT = 4096
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def big_worker() -> AsyncIterator[tuple[str, list[object]]]:
    """A worker whose answer size and form the request asks for in its ``user`` field ("SIZE",
    "SIZE:chunked", "SIZE:stream", or "SIZE:once": that size the first time only); it lists the
    connections its requests came on."""
    connections: list[object] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        connections.append(request.transport)
        size_text, _, form = (await request.json())["user"].partition(":")
        size = int(size_text) if form != "once" or len(connections) == 1 else 100  # "once": large the first time
        body = b'{"pad":"' + b"x" * max(0, size - 10) + b'"}'
        if form == "stream":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for _ in range(size // 1000):
                await response.write(b"data: " + b"y" * 992 + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        if form == "chunked":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            for start in range(0, len(body), 1000):
                await response.write(body[start:start + 1000])
            await response.write_eof()
            return response
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", connections
    await runner.cleanup()


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_answer_over_the_limit_is_a_502_and_the_connection_is_dropped(
    make_gateway: GatewayFactory, big_worker: tuple[str, list[object]], chunked: bool
) -> None:
    url, connections = big_worker
    client = make_gateway([record_for(url, model="m")], max_buffered_response_bytes=LIMIT, disable_retries=True)
    form = ":chunked" if chunked else ""
    small = await client.post("/v1/chat/completions", json={**CHAT, "user": f"{LIMIT}{form}"})
    assert small.status_code == 200 and len(small.content) == LIMIT
    large = await client.post("/v1/chat/completions", json={**CHAT, "user": f"{LIMIT + 1}{form}"})
    assert large.status_code == 502
    error = large.json()["error"]
    assert error["code"] == "upstream_unavailable" and str(LIMIT) in error["message"]
    again = await client.post("/v1/chat/completions", json={**CHAT, "user": f"100{form}"})
    assert again.status_code == 200
    # The first connection served two answers; the one that carried too much was not reused.
    assert len(connections) == 3 and connections[0] is connections[1] and connections[2] is not connections[1]


async def test_another_worker_takes_the_request(make_gateway: GatewayFactory, big_worker: tuple[str, list[object]]) -> None:
    url, connections = big_worker
    records = [record_for(url, model="m"), record_for(url + "/", model="m")]
    client = make_gateway(records, max_buffered_response_bytes=LIMIT, policy="round_robin")
    answer = await client.post("/v1/chat/completions", json={**CHAT, "user": f"{LIMIT * 2}:once"})
    assert answer.status_code == 200 and len(answer.content) == 100 and len(connections) == 2


async def test_a_streamed_answer_is_not_held_so_the_limit_does_not_apply(
    make_gateway: GatewayFactory, big_worker: tuple[str, list[object]]
) -> None:
    url, _ = big_worker
    client = make_gateway([record_for(url, model="m")], max_buffered_response_bytes=LIMIT)
    answer = await client.post("/v1/chat/completions", json={**CHAT, "stream": True, "user": f"{LIMIT * 4}:stream"})
    assert answer.status_code == 200 and len(answer.content) > LIMIT * 4 - 1000

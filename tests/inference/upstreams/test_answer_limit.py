"""Bounded memory against a worker's answer (issue 22, item 4; D53).

A relayed non-streamed answer is held only up to 256 KiB (or --max-buffered-response-bytes when that
is smaller), so a worker that breaks off inside it still fails the attempt cleanly (another worker,
or the 502 envelope); a longer one is relayed through as it arrives, never held whole, however long
it is: an endless body reaches the client while the worker is still sending, and the worker's
connection closes when the client leaves. Where the gateway must read an answer whole (a provider's
Responses object or one of its events), --max-buffered-response-bytes bounds it: more is a 502 and
the connection is dropped. Streamed answers are passed on, not held."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, AsyncIterator

import orjson
import pytest
from aiohttp import web

from gateway_project.asgi import application
from inference.asgi_io import ResponseAborted
from inference.routing.workers import WorkerRecord, WorkerStatus
from tests.conftest import GatewayFactory, record_for
from tests.framed_worker import CHAT_ANSWER, framed_worker

LIMIT = 4096
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
# A chat request as a server hands it to the application (tests that watch each ASGI message).
CHAT_SCOPE = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
    "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
    "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
    "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
}


def _response_object(size: int) -> dict[str, Any]:
    text = "x" * size
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    return {"id": "resp_up", "object": "response", "status": "completed", "model": "m", "output": [item],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}  # fmt: skip


@pytest.fixture
async def big_worker() -> AsyncIterator[tuple[str, list[object]]]:
    """A worker whose answer size and form the request asks for: on chat, its ``user`` field
    ("SIZE", "SIZE:chunked" or "SIZE:stream"); on /v1/responses (a provider), its metadata
    ``size`` and ``form`` ("whole": one response object; "event": its events, the item's about
    that large). It lists the connections its requests came on."""
    connections: list[object] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        connections.append(request.transport)
        size_text, _, form = (await request.json())["user"].partition(":")
        size = int(size_text)
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

    async def responses(request: web.Request) -> web.StreamResponse:
        connections.append(request.transport)
        metadata = (await request.json())["metadata"]
        whole = _response_object(int(metadata["size"]))
        if metadata["form"] == "whole":
            return web.json_response(whole)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        done = {"type": "response.output_item.done", "output_index": 0, "item": whole["output"][0]}
        await response.write(b"data: " + orjson.dumps(done) + b"\n\n")
        finished = {"type": "response.completed", "response": {**whole, "output": []}}
        await response.write(b"data: " + orjson.dumps(finished) + b"\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", responses)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", connections
    await runner.cleanup()


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_answer_past_the_hold_is_relayed_through_whole(
    make_gateway: GatewayFactory, big_worker: tuple[str, list[object]], chunked: bool
) -> None:
    url, connections = big_worker
    client = make_gateway([record_for(url, model="m")], max_buffered_response_bytes=LIMIT, disable_retries=True)
    form = ":chunked" if chunked else ""
    for size in (LIMIT, LIMIT * 16, 100):
        answer = await client.post("/v1/chat/completions", json={**CHAT, "user": f"{size}{form}"})
        assert answer.status_code == 200 and len(answer.content) == size and answer.json()["pad"]
        assert answer.headers["x-request-id"] and "x-gw-overhead-ms" in answer.headers
        if not chunked:  # the worker's declared length is passed on
            assert answer.headers["content-length"] == str(size)
    # Read to its end, the long answer left its connection fit for reuse.
    assert len(connections) == 3 and connections[0] is connections[1] is connections[2]


@pytest.mark.parametrize("framing", ["chunked", "close"])
async def test_an_endless_answer_streams_through_and_closes_when_the_client_leaves(
    make_gateway: GatewayFactory, framing: str
) -> None:
    """The client gets the head and far more than the hold while the worker never ends: nothing
    waits for the whole answer. When the client leaves, the worker's connection is closed."""
    async with framed_worker(framing, endless=True) as worker:  # type: ignore[arg-type]
        make_gateway([record_for(worker.url, model="m")], max_buffered_response_bytes=LIMIT)
        wanted = 64 * max(LIMIT, 65536)
        received = 0
        start: dict[str, Any] = {}
        leave = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if not start:
                start["asked"] = True
                return {"type": "http.request", "body": orjson.dumps(CHAT), "more_body": False}
            await leave.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal received
            if message["type"] == "http.response.start":
                start["status"] = message["status"]
            else:
                assert message.get("more_body"), "the endless answer ended"
                received += len(message.get("body", b""))
                if received >= wanted:
                    leave.set()

        await asyncio.wait_for(application(CHAT_SCOPE, receive, send), 30)
        assert start["status"] == 200 and received >= wanted
        await asyncio.wait_for(worker.peer_closed.wait(), 10)


async def test_a_worker_that_breaks_off_inside_the_hold_leaves_the_request_to_another(
    make_gateway: GatewayFactory,
) -> None:
    async with framed_worker("length", cut=True) as broken, framed_worker("length") as healthy:
        records = [record_for(broken.url, model="m"), record_for(healthy.url, model="m")]
        client = make_gateway(records, policy="round_robin")
        for _ in range(2):  # whichever the policy picks first
            answer = await client.post("/v1/chat/completions", json=CHAT)
            assert answer.status_code == 200 and answer.content == CHAT_ANSWER
        assert broken.connections >= 1 and healthy.connections >= 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("form", ["whole", "event"])
async def test_a_provider_answer_read_whole_is_bounded_by_the_limit(
    make_gateway: GatewayFactory, big_worker: tuple[str, list[object]], form: str
) -> None:
    url, connections = big_worker
    record = WorkerRecord(
        id=str(uuid.uuid4()), url=url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key="sk-provider", models=("m",),
    )  # fmt: skip
    client = make_gateway([record], ssrf_allow_loopback=True, history_backend="memory",
                          max_buffered_response_bytes=LIMIT, disable_retries=True)  # fmt: skip
    small = await client.post("/v1/responses", json={"model": "m", "input": "hi", "metadata": {"size": "100", "form": form}})
    assert small.status_code == 200 and small.json()["output"][0]["content"][0]["text"] == "x" * 100
    large = await client.post("/v1/responses", json={"model": "m", "input": "hi", "metadata": {"size": str(LIMIT), "form": form}})
    assert large.status_code == 502
    error = large.json()["error"]
    assert error["code"] == "upstream_unavailable" and str(LIMIT) in error["message"]
    again = await client.post("/v1/responses", json={"model": "m", "input": "hi", "metadata": {"size": "100", "form": form}})
    assert again.status_code == 200
    # The connection that carried too much was not reused.
    assert len(connections) == 3 and connections[2] is not connections[1]


async def test_a_streamed_answer_is_not_held_so_the_limit_does_not_apply(
    make_gateway: GatewayFactory, big_worker: tuple[str, list[object]]
) -> None:
    url, _ = big_worker
    client = make_gateway([record_for(url, model="m")], max_buffered_response_bytes=LIMIT)
    answer = await client.post("/v1/chat/completions", json={**CHAT, "stream": True, "user": f"{LIMIT * 4}:stream"})
    assert answer.status_code == 200 and len(answer.content) > LIMIT * 4 - 1000


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_an_answer_broken_off_after_the_response_started_is_never_finished(
    make_gateway: GatewayFactory, framing: str
) -> None:
    """Relayed through (longer than the hold) and then cut upstream: the response is left unfinished
    and ResponseAborted tells the server to close the connection, so the client's copy cannot pass
    for a whole answer (short of its Content-Length, or without the last chunk)."""
    async with framed_worker(framing, cut=True) as worker:  # type: ignore[arg-type]
        make_gateway([record_for(worker.url, model="m")], max_buffered_response_bytes=16, disable_retries=True)
        sent: list[dict[str, Any]] = []
        stays = asyncio.Event()
        asked: list[bool] = []

        async def receive() -> dict[str, Any]:
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": orjson.dumps(CHAT), "more_body": False}
            await stays.wait()  # the client stays: the abort is the gateway's own
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(dict(message))

        with pytest.raises(ResponseAborted):
            await asyncio.wait_for(application(CHAT_SCOPE, receive, send), 30)
    start, *body = sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers.get(b"content-length") == (str(len(CHAT_ANSWER)).encode() if framing == "length" else None)
    assert body and all(message.get("more_body") for message in body)  # never the body's end
    assert sum(len(message["body"]) for message in body) < len(CHAT_ANSWER)

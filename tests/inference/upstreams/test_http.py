"""The HTTP backend's own contract, through the gateway to a real mock worker: pooled keep-alive
connections, the total request timeout before and after the response starts, workers that drop the
connection, 1xx answers skipped, chunked answers decoded, and the final chunk of a stream."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from standins.mock_worker import mock_state
from tests.conftest import RunningWorker, record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


async def _sse_lines(client, body: dict) -> tuple[int, list[str]]:
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line]
    return response.status_code, lines


async def test_sequential_requests_reuse_one_upstream_connection(gateway, worker: RunningWorker) -> None:
    for body in (CHAT, {**CHAT, "stream": True}, CHAT, {**CHAT, "stream": True}, CHAT):
        response = await gateway.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
    ports = {entry["client_port"] for entry in worker.requests()}
    assert len(worker.requests()) == 5 and len(ports) == 1


async def test_a_reused_connection_keeps_its_answer_parser(gateway, worker: RunningWorker, monkeypatch) -> None:
    """The parser of a pooled connection's last answer reads the next one (a whole answer, a stream,
    chunked and by length, in turns): one parser per connection, not per request (issue 27, D86)."""
    from aiohttp.client_proto import ResponseHandler

    made: list[int] = []
    original = ResponseHandler.set_response_params

    def counted(self: ResponseHandler, **params: object) -> None:
        made.append(id(self))
        original(self, **params)  # type: ignore[arg-type]

    monkeypatch.setattr(ResponseHandler, "set_response_params", counted)
    for body in (CHAT, {**CHAT, "stream": True}, CHAT, {**CHAT, "stream": True}, CHAT, CHAT):
        response = await gateway.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        assert response.json()["object"] == "chat.completion" if not body.get("stream") else "data:" in response.text
    assert len({entry["client_port"] for entry in worker.requests()}) == 1
    assert len(made) == 1


async def test_worker_that_never_answers_gets_504(make_gateway, worker: RunningWorker) -> None:
    mock_state(worker.app).fault_hang = True
    client = make_gateway([record_for(worker)], request_timeout_secs=0.5, retry_max_retries=0)
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 504
    assert response.headers["x-gw-error-code"] == "upstream_timeout"
    assert response.json()["error"]["code"] == "upstream_timeout"


async def test_stream_past_the_request_timeout_ends_in_band(make_gateway, worker: RunningWorker) -> None:
    client = make_gateway([record_for(worker)], request_timeout_secs=0.6)
    body = {**CHAT, "stream": True, "mock": {"tokens": 40, "delay_ms": 50}}
    status, lines = await _sse_lines(client, body)
    assert status == 200
    assert lines[-1] == "data: [DONE]"
    error = orjson.loads(lines[-2][6:])["error"]
    assert error["type"] == "internal_error" and "timed out" in error["message"]
    tokens = [line for line in lines[:-2] if '"content"' in line]
    assert 0 < len(tokens) < 40


async def test_worker_dropping_the_connection_is_a_502_after_no_retry(make_gateway, worker: RunningWorker) -> None:
    mock_state(worker.app).fault_drop = True
    client = make_gateway([record_for(worker)], retry_max_retries=0)
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert response.headers["x-gw-error-code"] == "upstream_unavailable"


async def test_a_stream_whose_worker_sent_no_done_still_ends_with_one(make_gateway) -> None:
    async def no_done(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        await response.write(b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n')
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", no_done)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        client = make_gateway([record_for(url, model="mock-model")])
        body = {"model": "mock-model", "prompt": "x", "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            lines = [line async for line in response.aiter_lines() if line]
    finally:
        await runner.cleanup()
    assert lines == [
        'data: {"choices":[{"delta":{"content":"a"}}]}',
        'data: {"choices":[{"delta":{"content":"b"}}]}',
        "data: [DONE]",
    ]


async def test_informational_answers_are_skipped(make_gateway) -> None:
    """A worker that sends ``100 Continue`` before its answer: the client sees only the answer."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        body = b'{"id":"x","object":"chat.completion","choices":[]}'
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = make_gateway([record_for(f"http://127.0.0.1:{port}", model="mock-model")])
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert response.json() == {"id": "x", "object": "chat.completion", "choices": []}
        assert response.headers["content-length"] == str(len(response.content))
    finally:
        server.close()
        await server.wait_closed()


async def test_an_idle_connection_is_not_reused_past_the_keepalive(make_gateway, worker: RunningWorker) -> None:
    """Pooled connections idle longer than the backend's keep-alive are replaced, so a worker closing
    its idle connections (uvicorn: after 5 s) never gets a request on one it is closing."""
    from inference.routing.workers import Transport
    from inference.upstreams.http import KEEPALIVE_SECS, HttpRelay
    from inference.dataplane import data_plane

    assert KEEPALIVE_SECS < 5.0
    client = make_gateway([record_for(worker)])
    data_plane().relays[Transport.HTTP] = HttpRelay(data_plane().config.request_timeout_secs, keepalive_secs=0.2)
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    await asyncio.sleep(0.3)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    first, second, third = (entry["client_port"] for entry in worker.requests())
    assert first == second != third


async def test_many_concurrent_requests_to_one_worker_are_not_capped(gateway, worker: RunningWorker) -> None:
    """More requests at once than a per-host connection cap would allow (aiohttp's default is 100;
    500 was ours): all of them reach the worker at the same time, none waits for a connection slot."""
    state = mock_state(worker.app)
    body = {**CHAT, "mock": {"tokens": 1, "delay_ms": 60_000}}  # held at the worker until cancelled
    calls = [asyncio.ensure_future(gateway.post("/v1/chat/completions", json=body)) for _ in range(600)]
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while state.in_flight < 600 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert state.peak_in_flight == 600
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


async def test_done_inside_generated_text_does_not_end_the_stream(make_gateway) -> None:
    """A worker that omits [DONE] but whose last token is the text "[DONE]": the client still gets
    the closing event."""

    async def tricky(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"text":"say [DONE]"}]}\n\n')
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", tricky)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        client = make_gateway([record_for(f"http://127.0.0.1:{runner.addresses[0][1]}", model="mock-model")])
        body = {"model": "mock-model", "prompt": "x", "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            lines = [line async for line in response.aiter_lines() if line]
    finally:
        await runner.cleanup()
    assert lines == ['data: {"choices":[{"text":"say [DONE]"}]}', "data: [DONE]"]


def test_a_header_line_with_a_break_or_nul_is_refused() -> None:
    """A forwarded header's name or value holding CR, LF or NUL is never written into the worker's
    request head (a CONNECT failure); any other latin-1 text is written as given."""
    import pytest

    from inference.upstreams.failures import FailureKind, UpstreamFailure
    from inference.upstreams.http import _header_line

    assert _header_line("traceparent", "00-ab-cd-01") == b"traceparent: 00-ab-cd-01\r\n"
    assert _header_line("x-note", "caf\xe9\t ok") == b"x-note: caf\xe9\t ok\r\n"
    for bad in ("a\rb", "a\nb", "a\0b", "end\r", "\n"):
        with pytest.raises(UpstreamFailure) as refused:
            _header_line("x-note", bad)
        assert refused.value.kind is FailureKind.CONNECT
    with pytest.raises(UpstreamFailure):
        _header_line("x\r\nevil", "v")

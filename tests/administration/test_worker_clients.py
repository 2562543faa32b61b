"""The control plane's periodic requests to workers: one kept-alive connection per worker between
probes, a bounded answer (--max-worker-answer-bytes), timeouts and hang-ups as failures."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest
from aiohttp import web

from administration.worker_clients import WorkerClients, WorkerRequestFailed
from tests.conftest import free_port

LIMIT = 1024


@pytest.fixture
async def worker() -> AsyncIterator[tuple[str, list[object]]]:
    """A worker whose routes answer small, long (with and without a length) and slowly; it lists the
    connections its requests arrived on."""
    connections: list[object] = []

    async def small(request: web.Request) -> web.Response:
        connections.append(request.transport)
        return web.json_response({"ok": True})

    async def long_with_length(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * (LIMIT + 1))

    async def long_chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(4):
            await response.write(b"y" * (LIMIT // 2))
        await response.write_eof()
        return response

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", small)
    app.router.add_get("/long", long_with_length)
    app.router.add_get("/chunked", long_chunked)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", connections
    await runner.cleanup()


async def test_probes_reuse_one_connection(worker: tuple[str, list[object]]) -> None:
    url, connections = worker
    clients = WorkerClients(max_answer_bytes=LIMIT)
    try:
        answers = [await clients.get(url + "/health", {}, 5.0) for _ in range(3)]
        assert [answer.status for answer in answers] == [200] * 3 and answers[0].json() == {"ok": True}
        assert len(set(map(id, connections))) == 1
    finally:
        await clients.aclose()


@pytest.mark.parametrize("route", ["/long", "/chunked"])
async def test_an_answer_over_the_limit_is_a_failure(worker: tuple[str, list[object]], route: str) -> None:
    url, _ = worker
    clients = WorkerClients(max_answer_bytes=LIMIT)
    try:
        with pytest.raises(WorkerRequestFailed, match=str(LIMIT)):
            await clients.get(url + route, {}, 5.0)
        assert (await clients.get(url + "/health", {}, 5.0)).ok  # the next request is unharmed
    finally:
        await clients.aclose()


async def test_a_timeout_and_a_refused_connection_are_failures(worker: tuple[str, list[object]]) -> None:
    url, _ = worker
    clients = WorkerClients(max_answer_bytes=LIMIT)
    try:
        with pytest.raises(WorkerRequestFailed):
            await clients.get(url + "/slow", {}, 0.2)
        with pytest.raises(WorkerRequestFailed):
            await clients.get(f"http://127.0.0.1:{free_port()}/health", {}, 1.0)
    finally:
        await clients.aclose()


async def test_a_connection_the_worker_closed_between_probes_is_replaced(worker: tuple[str, list[object]]) -> None:
    """Engines close idle connections after 5 s, about the probe interval: the next probe opens a
    new connection instead of failing."""
    url, connections = worker
    clients = WorkerClients(max_answer_bytes=LIMIT)
    try:
        assert (await clients.get(url + "/health", {}, 5.0)).ok
        transport = connections[-1]
        assert isinstance(transport, asyncio.Transport)
        transport.close()  # the worker hangs up the idle connection
        await asyncio.sleep(0.05)
        assert (await clients.get(url + "/health", {}, 5.0)).ok
        assert len(set(map(id, connections))) == 2
    finally:
        await clients.aclose()

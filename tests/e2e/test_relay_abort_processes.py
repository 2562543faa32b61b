"""A whole answer relayed through (past the hold, D53) that its worker breaks off after the response
started, in a gateway process under uvicorn and daphne: the client's copy is cut short of its
Content-Length (never a whole-looking 200), the connection ends, the gateway keeps serving, and no
process logs an unhandled exception (the spawn fixture's check). The worker is the raw framed
worker of tests/framed_worker.py, on its own event loop in a thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Iterator

import httpx
import pytest

from tests.e2e.conftest import Process
from tests.framed_worker import framed_worker

pytestmark = pytest.mark.e2e


@pytest.fixture
def cut_worker() -> Iterator[str]:
    """A worker whose POST answers declare their length and stop halfway."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    url: list[str] = []
    stop = asyncio.Event()

    async def serve() -> None:
        async with framed_worker("length", cut=True) as worker:
            url.append(worker.url)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield url[0]
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    if not thread.is_alive():
        loop.close()


def test_an_answer_broken_off_after_it_started_reaches_the_client_cut(
    start_gateway: Callable[..., Process], cut_worker: str
) -> None:
    gateway = start_gateway("--worker-urls", cut_worker, "--max-buffered-response-bytes", "16",
                            "--disable-health-check", "--retry-max-retries", "0")  # fmt: skip
    body = {"model": "framed-model", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError):  # the body ended short of its length
            httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=10)
    assert httpx.get(gateway.url + "/liveness", timeout=5).status_code == 200
    assert "broke off after the response started" in gateway.log()

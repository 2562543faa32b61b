"""Bounded request receipt in a real gateway process, under uvicorn and daphne, and under
``--workers 2`` (every serving process applies the flags): a head past its size or header count gets
431 (a header line that never ends, as it arrives), a head or body that stops gets 408, a connection
that sends nothing is closed, and each time the connection ends. Raw sockets; flags set small so the
deadlines pass quickly."""

from __future__ import annotations

import json
import socket
import time
from typing import Callable

import pytest

from tests.e2e.conftest import Process, wait_for
from tests.e2e.test_serving_processes import serving_pids, start_supervised  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

FLAGS = ("--max-request-head-bytes", "4096", "--max-request-headers", "20", "--request-head-timeout-secs", "1",
         "--request-body-timeout-secs", "1", "--min-request-body-rate", "100")


def _talk(url: str, *parts: bytes, pause: float = 0.0, timeout: float = 10.0) -> tuple[bytes, float]:
    """Send ``parts`` until the gateway answers; return what it sent before closing, and how long
    the whole exchange took."""
    host, port = url.removeprefix("http://").split(":")
    began = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        for index, part in enumerate(parts):
            if index and pause:
                time.sleep(pause)
            try:
                sock.sendall(part)
            except OSError:
                break
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            received += data
    return received, time.monotonic() - began


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _code(answer: bytes) -> str:
    return str(json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"])


def _endless_header(url: str) -> tuple[int, bytes]:
    """Send a 64 MiB header line until the gateway closes; what was sent, and what came back."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            for _ in range(1024):
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:  # reset or broken pipe: the gateway closed
            pass
        received = b""
        try:
            while data := sock.recv(65536):
                received += data
        except OSError:
            pass
    return sent, received


def _check_receipt(url: str) -> None:
    big, _ = _talk(url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 6000 + b"\r\n\r\n")
    assert (_status(big), _code(big)) == (431, "request_header_fields_too_large"), big[:300]
    # A header line that never ends is refused while it arrives (issue 22, item 4): the client could
    # send no more than the limit, one read and the sockets' buffers, far from its 64 MiB.
    sent, endless = _endless_header(url)
    assert (_status(endless), _code(endless)) == (431, "request_header_fields_too_large"), endless[:300]
    assert sent < 16 * 2**20, sent
    many = b"".join(b"X-H%d: v\r\n" % index for index in range(30))
    counted, _ = _talk(url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert _status(counted) == 431, counted[:300]
    stalled_head, took = _talk(url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    assert (_status(stalled_head), _code(stalled_head)) == (408, "request_timeout"), stalled_head[:300]
    assert took < 8  # closed by the 1 s deadline, not by the socket's 10 s timeout
    stalled_body, took = _talk(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                    b"\r\nContent-Length: 500\r\n\r\n{\"model\":")
    assert (_status(stalled_body), _code(stalled_body)) == (408, "request_timeout"), stalled_body[:300]
    assert took < 8
    silent, took = _talk(url)
    assert silent == b"" and took < 8
    ordinary, _ = _talk(url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _status(ordinary) == 200, ordinary[:300]


@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_request_receipt_is_bounded_under_each_server(
    start_gateway: Callable[..., Process], mock_worker_process: Process
) -> None:
    gateway = start_gateway("--worker-urls", mock_worker_process.url, *FLAGS)
    _check_receipt(gateway.url)


def test_request_receipt_is_bounded_in_every_serving_process(
    start_supervised, mock_worker_process: Process  # noqa: F811
) -> None:
    gateway, _ = start_supervised("--worker-urls", mock_worker_process.url, *FLAGS)
    # New connections land on either process; enough rounds reach both (the kernel spreads accepts).
    for _ in range(3):
        _check_receipt(gateway.url)
    wait_for(lambda: len(serving_pids(gateway)) == 2, 5, "both serving processes still up", gateway)

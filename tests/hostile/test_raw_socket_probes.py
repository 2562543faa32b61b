"""Raw-socket probes against a live gateway process (uvicorn and daphne) in front of a mock worker,
for every route family: malformed request lines, HTTP/0.9, bad versions, invalid header bytes, bad
chunked framing, impossible Content-Length values, smuggling-shaped framing, an Upgrade, pipelining.
Each probe is sent whole and the write side shut: the gateway answers a 4xx (or 501/505, a protocol
feature it does not serve) or closes the connection, never a 5xx of its own and never a hang; it keeps
serving; and its log holds no unhandled exception (the spawn fixture checks it).

Head size, header count and receipt deadlines are tested with their flags in
tests/e2e/test_request_receipt_processes.py, not here."""

from __future__ import annotations

import re
import socket
from typing import Callable

import pytest

from tests.e2e.conftest import Process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# One path per route family: relayed (schema-checked and plain), models, probes, fleet routes,
# control plane, fan-out routes, console, static files, unknown.
FAMILIES = ["/v1/chat/completions", "/v1/embeddings", "/v1/models", "/readiness", "/loads", "/get_model_info",
            "/workers", "/flush_cache", "/admin/login/", "/static/admin/css/base.css", "/nowhere"]
CHAT = b'{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}'
# Statuses a protocol-level refusal may take besides 4xx.
PROTOCOL_REFUSALS = {501, 505}
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


def probes(path: str) -> dict[str, bytes]:
    p = path.encode()
    return {
        "junk after the version": b"GET " + p + b" HTTP/1.1 junk\r\nHost: x\r\n\r\n",
        "no version (HTTP/0.9)": b"GET " + p + b"\r\n\r\n",
        "unknown version": b"GET " + p + b" HTTP/9.9\r\nHost: x\r\n\r\n",
        "lowercase method": b"get " + p + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "binary request line": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + p + b"\r\n\r\n",
        "space in the target": b"GET " + p + b" x HTTP/1.1\r\nHost: x\r\n\r\n",
        "NUL in a header value": b"GET " + p + b" HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
        "space in a header name": b"GET " + p + b" HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
        "DEL in a header name": b"GET " + p + b" HTTP/1.1\r\nHost: x\r\nX\x7fA: v\r\n\r\n",
        "header without a colon": b"GET " + p + b" HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n",
        "obsolete line folding": b"GET " + p + b" HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\n\r\n",
        "bare LF line ends": b"GET " + p + b" HTTP/1.1\nHost: x\n\n",
        "non-hex chunk size": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        "chunk size past 64 bits": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   b"ffffffffffffffffffffff\r\n{}\r\n0\r\n\r\n",
        "chunk without its CRLF": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  b"2\r\n{}XX0\r\n\r\n",
        "unknown transfer coding": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, zork\r\n\r\n",
        "huge Content-Length": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 99999999999999999999999\r\n\r\n{}",
        "negative Content-Length": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
        "two Content-Lengths": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                               b"Content-Length: 3\r\n\r\n{}x",
        "Content-Length and chunked": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "body shorter than declared": b"POST " + p + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                      b"Content-Length: 50\r\n\r\n{}",
        "websocket upgrade": b"GET " + p + b" HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                             b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        "h2c prior knowledge": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "absolute-form target": b"GET http://evil.example" + p + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "percent-encoded NUL": b"GET " + p + b"%00 HTTP/1.1\r\nHost: x\r\n\r\n",
        "invalid percent-encoding": b"GET " + p + b"%zz%ff%c0%af HTTP/1.1\r\nHost: x\r\n\r\n",
        "Latin-1 header value": b"GET " + p + b" HTTP/1.1\r\nHost: x\r\nX-Request-ID: caf\xe9\r\n"
                                b"Authorization: Bearer \xff\xfe\r\n\r\n",
    }


def _exchange(url: str, payload: bytes, half_close: bool = True, timeout: float = 10.0) -> bytes:
    """Send ``payload`` whole (then shut the write side), read until the gateway closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(payload)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return received
            except socket.timeout:
                raise AssertionError(f"no answer and no close within {timeout} s; got {received[:300]!r}") from None
            if not data:
                return received
            received += data


def _statuses(received: bytes) -> list[int]:
    """The status of each response in ``received``, read in sequence by its framing (Content-Length,
    chunked, or to the end)."""
    statuses: list[int] = []
    rest = received
    while rest:
        match = STATUS.match(rest)
        if match is None:
            break  # not a response (an HTTP/0.9 answer has no status line)
        statuses.append(int(match.group(1)))
        head, separator, rest = rest.partition(b"\r\n\r\n")
        if not separator:
            break
        headers = dict(
            (name.strip().lower(), value.strip())
            for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
        )
        if b"content-length" in headers:
            rest = rest[int(headers[b"content-length"]):]
        elif headers.get(b"transfer-encoding") == b"chunked":
            while rest:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                rest = rest[size + 2:]
                if size == 0:
                    break
        elif statuses[-1] not in (204, 304) and not 100 <= statuses[-1] < 200:
            break  # delimited by the close
    return statuses


def _alive(gateway: Process) -> None:
    received = _exchange(gateway.url, b"GET /liveness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _statuses(received)[:1] == [200], received[:300]


@pytest.fixture
def gateway(start_gateway: Callable[..., Process], mock_worker_process: Process) -> Process:
    return start_gateway("--worker-urls", mock_worker_process.url)


def test_malformed_requests_get_a_4xx_or_a_close(gateway: Process) -> None:
    """Every probe on every route family; the failures are collected and reported together."""
    failures: list[str] = []
    for path in FAMILIES:
        for name, payload in probes(path).items():
            received = _exchange(gateway.url, payload)
            statuses = _statuses(received)
            server_error = b"internal_error" in received or b"Internal Server Error" in received
            if server_error or any(status >= 500 and status not in PROTOCOL_REFUSALS for status in statuses):
                failures.append(f"{path} {name}: {received[:300]!r}")
            elif name in ("junk after the version", "non-hex chunk size", "two Content-Lengths") and statuses:
                # Framing the servers cannot read is refused at the protocol level, before any route.
                if statuses[0] < 400:
                    failures.append(f"{path} {name} was served: {statuses}")
        _alive(gateway)
    assert not failures, "\n".join(failures)


def test_pipelined_requests_are_answered_in_order(gateway: Process) -> None:
    chat = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT))
    pipeline = (
        b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n"
        + chat
        + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"GET /static/../settings.py HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"GET /workers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    received = _exchange(gateway.url, pipeline, half_close=False)
    assert _statuses(received) == [200, 200, 200, 404, 404, 200], received[:1500]


def test_a_bad_request_in_a_pipeline_ends_it_cleanly(gateway: Process) -> None:
    """The pipeline ends at the bad request with a 400 (uvicorn parses what arrived at once and may
    refuse before answering the good request ahead of it; daphne answers it first); nothing after it
    is served."""
    pipeline = b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\nGET /x HTTP/1.1 junk\r\n\r\nGET /liveness HTTP/1.1\r\n\r\n"
    statuses = _statuses(_exchange(gateway.url, pipeline, half_close=False))
    assert statuses in ([400], [200, 400]), statuses
    _alive(gateway)

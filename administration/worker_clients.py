"""The control plane's periodic requests to workers (health probes, load polls), sized to the fleet.

These run once per worker per interval, so at a thousand workers they are the control plane's
steady cost. They go through aiohttp, the HTTP client the data plane relays with, the way the relay
uses it (docs/DECISIONS.md D13, D23): a pooled connection from aiohttp's connector, the request head
written as bytes, the answer read by aiohttp's C parser, none of the session's per-request
machinery. Per probe that is a fraction of httpx's CPU. One connector per checker keeps a connection
per worker alive between probes (pooled by host and port, looked up by key, never scanned), with
one TLS context for all; a bound on how many requests are in flight at once, whose timeouts start
only when a request gets its turn; and a bound on how much of an answer is read
(``--max-worker-answer-bytes``). One-off requests (registration's discovery, the fan-out routes)
stay on httpx.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

import aiohttp
import orjson
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import TimerNoop
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from common.config import current_config
from common.http_clients import tls_context

__all__ = ["WorkerClients", "WorkerAnswer", "WorkerRequestFailed", "MAX_CONCURRENT"]

MAX_CONCURRENT = 64
# An idle connection to a worker is kept this long (longer than the probe interval, so a probe
# reuses the last one); a worker that closes it sooner (engines close after 5 s) gets a new one.
_KEEPALIVE_SECS = 30.0
_NO_TIMER = TimerNoop()
_READ_BUFSIZE = 2**16


class WorkerRequestFailed(Exception):
    """No answer: the worker could not be reached, timed out, hung up, or answered too much."""


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class WorkerClients:
    def __init__(self, max_concurrent: int = MAX_CONCURRENT, max_answer_bytes: int | None = None) -> None:
        self.max_concurrent = max_concurrent
        self.max_answer_bytes = max_answer_bytes or current_config().max_worker_answer_bytes
        self._pool: aiohttp.TCPConnector | None = None
        self._slots: asyncio.Semaphore | None = None
        self._targets: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[aiohttp.ClientRequest, bytes]] = {}
        self._no_timeout = aiohttp.ClientTimeout()  # the caller's asyncio.timeout bounds the exchange

    def _connector(self) -> aiohttp.TCPConnector:
        if self._pool is None or self._pool.closed:
            self._pool = aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_SECS, ssl=tls_context())
        return self._pool

    def _target(self, url: str, headers: Mapping[str, str]) -> tuple[aiohttp.ClientRequest, bytes]:
        """What the connector pools on and the request head, made once per URL and headers."""
        key = (url, tuple(headers.items()))
        found = self._targets.get(key)
        if found is None:
            if len(self._targets) > 4 * 4096:
                self._targets.clear()
            parsed = URL(url)
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise WorkerRequestFailed(f"not an HTTP worker URL: {url}")
            lines = [f"GET {parsed.raw_path_qs} HTTP/1.1", f"Host: {parsed.host_port_subcomponent or parsed.host}"]
            lines += [f"{name}: {value}" for name, value in headers.items()]
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            probe = aiohttp.ClientRequest("GET", parsed, loop=asyncio.get_running_loop(), ssl=True)
            found = self._targets[key] = (probe, head)
        return found

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """One of the ``max_concurrent`` places; a request's timeout starts inside it."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        async with self._slots:
            yield

    async def get(self, url: str, headers: Mapping[str, str], timeout_secs: float) -> WorkerAnswer:
        """GET ``url`` in turn; the whole exchange within ``timeout_secs`` once it has its turn. A
        kept-alive connection the worker closed just as it was reused is retried once on a new one."""
        probe, head = self._target(url, headers)
        async with self.turn():
            for attempt in (1, 2):
                try:
                    async with asyncio.timeout(timeout_secs):
                        return await self._exchange(probe, head, url)
                except aiohttp.ServerDisconnectedError as exc:
                    if attempt == 2:
                        raise WorkerRequestFailed(f"{url}: the worker hung up") from exc
                except TimeoutError as exc:
                    raise WorkerRequestFailed(f"{url}: no answer within {timeout_secs:g} s") from exc
                except (aiohttp.ClientError, HttpProcessingError, OSError, ValueError) as exc:
                    raise WorkerRequestFailed(f"{url}: {exc!r}") from exc
        raise AssertionError("unreachable")

    async def _exchange(self, probe: aiohttp.ClientRequest, head: bytes, url: str) -> WorkerAnswer:
        limit = self.max_answer_bytes
        conn = await self._connector().connect(probe, traces=[], timeout=self._no_timeout)
        try:
            protocol: ResponseHandler | None = conn.protocol
            transport = conn.transport
            if protocol is None or transport is None:
                raise aiohttp.ServerDisconnectedError()
            # read_until_eof: an answer framed by neither a length nor chunks ends at the close (HTTP/1.1)
            protocol.set_response_params(
                timer=_NO_TIMER, auto_decompress=False, read_bufsize=_READ_BUFSIZE, read_until_eof=True
            )
            transport.write(head)
            while True:
                message, payload = await protocol.read()
                if not (100 <= message.code <= 199):
                    break
            length = message.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > limit:
                raise WorkerRequestFailed(f"{url}: answer of {length} bytes (limit {limit})")
            body = bytearray()
            while chunk := await payload.readany():
                body += chunk
                if len(body) > limit:
                    raise WorkerRequestFailed(f"{url}: answer longer than {limit} bytes")
        except BaseException:
            conn.close()
            raise
        if payload.is_eof() and not message.should_close:
            conn.release()
        else:
            conn.close()
        return WorkerAnswer(message.code, bytes(body))

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

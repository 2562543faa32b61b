"""HTTP workers: relay the request with aiohttp and the worker's answer back, streaming as it arrives.

One aiohttp ClientSession per event loop (created lazily: daphne sends no lifespan events) owns the
TCPConnector that pools keep-alive connections per worker. The request path uses that connector and
aiohttp's response protocol (its C HTTP parser and payload reader) directly rather than
``session.post``: the session's per-request machinery (ClientRequest, redirects, cookies, traces,
middlewares, ClientResponse) cost ~50 us of a relay's ~200 us of CPU, and a relay to a worker needs
none of it (docs/DECISIONS.md D13). What the session gave and this module keeps:

- connections from the pool, released for reuse once the answer was read to its end, closed when it
  was not (a cancelled or failed relay never returns a half-read connection to the pool);
- the connect timeout, and the total ``--request-timeout-secs`` deadline over the whole exchange, up
  to the last byte of the answer;
- informational (1xx) answers skipped, chunked answers decoded by aiohttp's parser.

Cancelling the relaying task (the client went away) closes the upstream connection, which is how a
client disconnect reaches the worker.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import aiohttp
import orjson
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from aiohttp.helpers import TimerNoop
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from yarl import URL

from inference.api.asgi_io import SSE_HEADERS, Send
from inference.backends.base import Backend, FinalHook, RelayRequest, Upstream, UpstreamFailure

__all__ = ["HttpBackend", "KEEPALIVE_SECS"]

log = logging.getLogger(__name__)

_DONE = b"data: [DONE]\n\n"
_DONE_MARK = b"[DONE]"
_TAIL = 32  # bytes of the stream's end enough to see its closing event
_DATA = b"data:"
_CONNECT_TIMEOUT_SECS = 10.0
# An idle pooled connection is reused only this long. Engines' HTTP servers close idle keep-alive
# connections after 5 s (uvicorn's default, which sglang and vllm keep); a request written on a
# connection the worker is closing at that moment is lost (502). Staying under it avoids the race.
KEEPALIVE_SECS = 4.0
_READ_BUFSIZE = 2**16
_ONE_WRITE_MAX = 2**16  # bodies up to this size go out in the same write as the head
_NO_TIMER = TimerNoop()
_BREAKS = frozenset(b"\r\n\x00")


def _header_line(name: str, value: str) -> bytes:
    line = f"{name}: {value}\r\n".encode("latin-1")
    if _BREAKS.intersection(line[:-2]):
        raise UpstreamFailure("connect", f"header {name} holds a line break")
    return line


@dataclass(frozen=True, slots=True)
class _Target:
    """One worker route, prepared once: what the connector pools on, and the request head's fixed
    lines (request line, Host, Content-Type, the worker's key)."""

    probe: aiohttp.ClientRequest  # never sent; names the pool (host, port, TLS) for connector.connect
    head: bytes


class _Deadline:
    """The total request timeout: cancels the relaying task when it passes; ``expired`` tells that
    cancellation from any other (a client disconnect)."""

    __slots__ = ("_task", "_handle", "expired", "_pending")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.expired = False
        self._pending = False  # a cancellation of ours not yet undone
        self._task = asyncio.current_task()
        self._handle = loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._pending = True
            self._task.cancel()

    def absorb(self) -> bool:
        """After a CancelledError: True (and the cancellation undone) when it was this deadline."""
        if not self.expired:
            return False
        self._undo()
        return True

    def cancel(self) -> None:
        """The exchange is over. A deadline that fired as it ended must not cancel what comes next."""
        self._handle.cancel()
        self._undo()

    def _undo(self) -> None:
        if self._pending and self._task is not None:
            self._pending = False
            self._task.uncancel()


class _Exchange:
    """A request on a pooled connection whose answer's head is read and whose body is not."""

    __slots__ = ("conn", "payload", "deadline")

    def __init__(self, conn: Connection, payload: StreamReader, deadline: _Deadline) -> None:
        self.conn = conn
        self.payload = payload
        self.deadline = deadline

    def finish(self) -> None:
        """Back to the pool when the answer was read to its end (and the worker keeps it alive)."""
        self.deadline.cancel()
        if self.payload.is_eof():
            self.conn.release()
        else:
            self.conn.close()

    def close(self) -> None:
        self.deadline.cancel()
        self.conn.close()


def _ends_with_done(tail: bytes) -> bool:
    """Whether a stream's last event is ``[DONE]`` (the text inside a JSON chunk never ends it)."""
    return tail.rstrip().endswith(_DONE_MARK)


class HttpBackend(Backend):
    transport = "http"

    def __init__(self, request_timeout_secs: float, keepalive_secs: float = KEEPALIVE_SECS) -> None:
        self._keepalive_secs = keepalive_secs
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout_secs, connect=_CONNECT_TIMEOUT_SECS, sock_connect=_CONNECT_TIMEOUT_SECS
        )
        self._request_timeout_secs = request_timeout_secs
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._targets: dict[tuple[str, str, str | None], _Target] = {}

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            # No connection cap: a long stream holds its connection for minutes, and a cap would make
            # request N+1 wait for the connect timeout and fail. --max-concurrent-requests is the limit.
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=0, keepalive_timeout=self._keepalive_secs, enable_cleanup_closed=True
            )
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # a relay keeps no cookies
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                read_bufsize=_READ_BUFSIZE,
            )
            self._sessions[loop] = session
        return session

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    def _target(self, base: str, path: str, api_key: str | None) -> _Target:
        """The prepared route (URL parsing and the fixed head lines are a visible share of a relay)."""
        key = (base, path, api_key)
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) > 4096:
                self._targets.clear()
            url = URL(base.rstrip("/") + path)
            if url.scheme not in ("http", "https") or not url.host:
                raise UpstreamFailure("connect", f"not an HTTP worker URL: {base}")
            head = b"POST " + url.raw_path_qs.encode("ascii") + b" HTTP/1.1\r\n"
            head += _header_line("Host", url.host_port_subcomponent or url.host)
            head += b"Content-Type: application/json\r\n"
            if api_key:
                head += _header_line("Authorization", f"Bearer {api_key}")
            probe = aiohttp.ClientRequest("POST", url, loop=asyncio.get_running_loop(), ssl=True)
            target = self._targets[key] = _Target(probe, head)
        return target

    def _head(self, target: _Target, request: RelayRequest) -> bytes:
        parts = [target.head, b"Content-Length: %d\r\nX-Request-ID: " % len(request.body), request.request_id, b"\r\n"]
        if request.stream:
            parts.append(b"Accept: text/event-stream\r\n")
        for name, value in request.headers:
            parts.append(_header_line(name, value))
        parts.append(b"\r\n")
        return b"".join(parts)

    def _failure(self, exc: BaseException) -> UpstreamFailure:
        if isinstance(exc, aiohttp.ClientConnectorError):
            return UpstreamFailure("connect", f"cannot connect to {exc.host}:{exc.port}")
        if isinstance(exc, asyncio.TimeoutError):
            return UpstreamFailure("connect", f"no connection within {_CONNECT_TIMEOUT_SECS:g} seconds")
        if isinstance(exc, aiohttp.ClientError):
            return UpstreamFailure("broken", type(exc).__name__)
        return UpstreamFailure("broken", f"{type(exc).__name__}: {exc}")

    def _timed_out(self) -> UpstreamFailure:
        return UpstreamFailure("timeout", "timed out", self._request_timeout_secs)

    async def open(self, request: RelayRequest) -> Upstream:
        target = self._target(request.worker.url, request.path, request.worker.record.api_key)
        head = self._head(target, request)
        session = self.session()
        connector = session.connector
        assert connector is not None
        deadline = _Deadline(asyncio.get_running_loop(), self._request_timeout_secs)
        conn: Connection | None = None
        try:
            conn = await connector.connect(target.probe, traces=[], timeout=self._timeout)
            protocol: ResponseHandler | None = conn.protocol
            transport = conn.transport
            if protocol is None or transport is None:
                raise aiohttp.ServerDisconnectedError()
            protocol.set_response_params(
                timer=_NO_TIMER, auto_decompress=False, read_bufsize=_READ_BUFSIZE
            )
            body = request.body
            if len(body) <= _ONE_WRITE_MAX:
                transport.write(head + body)
            else:
                transport.writelines((head, body))
            while True:
                message, payload = await protocol.read()
                if not (100 <= message.code <= 199) or message.code == 101:
                    break
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()
            deadline.cancel()
            if deadline.absorb():
                raise self._timed_out() from None
            raise
        except (aiohttp.ClientError, HttpProcessingError, OSError, asyncio.TimeoutError) as exc:
            if conn is not None:
                conn.close()
            deadline.cancel()
            raise self._failure(exc) from None
        except BaseException:
            if conn is not None:
                conn.close()
            deadline.cancel()
            raise
        content_type = message.headers.get("Content-Type", "")
        return Upstream(message.code, content_type, _Exchange(conn, payload, deadline))

    async def discard(self, upstream: Upstream) -> None:
        exchange: _Exchange = upstream.handle
        exchange.close()

    async def forward(self, upstream: Upstream, request: RelayRequest, send: Send, before_final: FinalHook) -> bool:
        exchange: _Exchange = upstream.handle
        try:
            if request.stream and upstream.status == 200 and upstream.content_type.startswith("text/event-stream"):
                clean = await self._relay_stream(exchange, request, send, before_final)
            else:
                await self._relay_whole(upstream, exchange, request, send, before_final)
                clean = True
        except BaseException:
            # Cancelled (client gone), timed out or failed: drop the upstream connection.
            exchange.close()
            raise
        exchange.finish()
        return clean

    async def _relay_whole(
        self, upstream: Upstream, exchange: _Exchange, request: RelayRequest, send: Send, before_final: FinalHook
    ) -> None:
        reading = perf_counter()
        try:
            body = await exchange.payload.read()
        except asyncio.CancelledError:
            if exchange.deadline.absorb():
                raise self._timed_out() from None
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._failure(exc) from None
        headers = [(b"x-request-id", request.request_id), (b"content-length", b"%d" % len(body))]
        if upstream.content_type:
            headers.append((b"content-type", upstream.content_type.encode("latin-1")))
        if request.on_start is not None:
            request.on_start(headers, perf_counter() - reading)
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        before_final()
        await send({"type": "http.response.body", "body": body})

    async def _relay_stream(
        self, exchange: _Exchange, request: RelayRequest, send: Send, before_final: FinalHook
    ) -> bool:
        headers = [*SSE_HEADERS, (b"x-request-id", request.request_id)]
        if request.on_start is not None:
            request.on_start(headers, 0.0)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        payload = exchange.payload
        observer = request.observer
        first_at = 0.0
        events = 0
        previous = last = b""
        try:
            while True:
                chunk = await payload.readany()
                if not chunk:
                    break
                if not first_at:
                    first_at = perf_counter()
                    if observer is not None:
                        observer.first_chunk(first_at)
                events += chunk.count(_DATA)
                if payload.is_eof():
                    # The worker's stream ended with this chunk: send it as the last body message.
                    if not _ends_with_done(last[-_TAIL:] + chunk[-_TAIL:]):
                        chunk += _DONE
                    before_final()
                    self._observe_end(observer, first_at, events)
                    await send({"type": "http.response.body", "body": chunk})
                    return True
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                previous, last = last, chunk
        except asyncio.CancelledError:
            if not exchange.deadline.absorb():
                raise
            return await self._end_broken(self._timed_out(), request, send, before_final)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return await self._end_broken(self._failure(exc), request, send, before_final)
        before_final()
        self._observe_end(observer, first_at, events)
        final = b"" if _ends_with_done(previous[-_TAIL:] + last[-_TAIL:]) else _DONE
        await send({"type": "http.response.body", "body": final})
        return True

    @staticmethod
    def _observe_end(observer: Any, first_at: float, events: int) -> None:
        if observer is not None and first_at:
            observer.stream_ended(first_at, perf_counter(), events)

    async def _end_broken(self, failure: UpstreamFailure, request: RelayRequest, send: Send, before_final: FinalHook) -> bool:
        """The response has started: report the failure in-band (spec 1, Streaming), then end the stream."""
        log.warning("upstream stream from %s failed: %s", request.worker.url, failure.detail)
        event = {"error": {"message": f"Worker stream failed: {failure.detail}", "type": "internal_error"}}
        await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(event) + b"\n\n", "more_body": True})
        before_final()
        await send({"type": "http.response.body", "body": _DONE})
        return False

"""HTTP workers: relay the request with aiohttp and the worker's answer back, streaming as it arrives.
The bytes go to the surface's response writer, which owns headers and framing.

One aiohttp ClientSession per event loop (created lazily: daphne sends no lifespan events) owns the
TCPConnector that pools keep-alive connections per worker. The request path uses that connector and
aiohttp's response protocol (its C HTTP parser and payload reader) directly rather than
``session.post``: the session's per-request machinery (ClientRequest, redirects, cookies, traces,
middlewares, ClientResponse) cost ~50 us of a relay's ~200 us of CPU, and a relay to a worker needs
none of it (docs/DECISIONS.md D13). What the session gave and this module keeps:

- connections from the pool, released for reuse once the answer was read to its end, closed when it
  was not (a cancelled or failed relay never returns a half-read connection to the pool). A request
  written on a pooled connection the worker had closed (it hung up or reset before any byte of an
  answer) is sent once more on a new connection (spec 3's gw_router_upstream_send_retries_total: one
  resend when the first send fails before any response; not an attempt of the retry policy, never
  the worker's failure); over HTTP/2, a stream the worker did not process (GOAWAY, REFUSED_STREAM).
  A new connection the worker closes unanswered is its failure, never sent twice (D113). Workers'
  idle connections are pooled here (:class:`_IdlePool`: the connector's rules, first in first out,
  none reused past the worker's idle time, expired ones closed by a sweep, at most the worker's
  ``pool_max_idle_per_host`` kept), the connector opening new ones and closing them (a TLS one's
  transport then cleaned up by it): its ``connect`` and ``release`` per request cost 18k instructions
  of a relay's ~960k in-process (issue 27, D82);
- the connect timeout, and the total deadline over the whole exchange, up to the last byte of the
  answer: the worker's http_pool block (``connect_timeout_secs``, ``timeout_secs``), else 10 s and
  ``--request-timeout-secs`` (D102);
- informational (1xx) answers skipped, chunked answers decoded by aiohttp's parser;
- an answer with neither Content-Length nor chunked coding read to the connection's close, as
  HTTP/1.1 says (aiohttp's parser defaults to an empty body there, which relayed a 200 with nothing).

Cancelling the relaying task (the client went away) closes the upstream connection, which is how a
client disconnect reaches the worker.

A worker whose record says HTTP/2 (``WorkerRecord.http2``: its http_pool.http2, or found speaking it
under --upstream-http2; D111) is reached over HTTP/2 with prior knowledge
(:mod:`inference.upstreams.http2`); its answer is read by the same :class:`_HttpAnswer`, the stream
standing in for aiohttp's payload reader, and a cancelled relay resets the stream (RST_STREAM CANCEL)
instead of closing a connection other requests share.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import deque
from dataclasses import dataclass
from time import monotonic, perf_counter
from typing import AsyncIterator

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ConnectionKey
from aiohttp.connector import Connection
from aiohttp.helpers import TimerNoop
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from yarl import URL

from common.config import GatewayConfig
from common.http_clients import tls_context
from common.relay_metrics import UPSTREAM_SEND_RETRIES
from common.telemetry import _add
from inference.accounting import CLEAN, Delivered, TokenUsage
from inference.routing.workers import HttpPool, Transport, WorkerRecord
from inference.upstreams.base import RELAYS, Relay, RelayAnswer, RelayRequest
from inference.upstreams.deadline import Deadline as _Deadline
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.http2 import H2Pool, H2Stream, StreamRefused, literal, request_block
from inference.upstreams.usage_estimate import stream_estimate
from inference.upstreams.usage_scan import StreamUsage, usage_in_body, usage_key
from inference.writers import ResponseWriter

__all__ = ["HOLD_BYTES", "HttpRelay", "KEEPALIVE_SECS"]

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_SECS = 10.0
# An idle pooled connection is reused only this long (--upstream-pool-idle-timeout-secs, a worker's
# pool_idle_timeout_secs). Engines' HTTP servers close idle keep-alive connections after 5 s
# (uvicorn's default, which sglang and vllm keep); staying under it avoids writing a request on a
# connection the worker is closing at that moment. A worker that closes sooner (or restarted) still
# meets that race: such a request is sent once more on a new connection (HttpRelay.open, HttpRelay._resending).
KEEPALIVE_SECS = 3.0
_MAX_IDLE = 500  # idle connections kept per worker host (spec 3's pool_max_idle_per_host default)
# The sweep also closes the connections due within this long: one wake-up for those expiring together.
_SWEEP_SLACK_SECS = 0.05
_FOREVER = float("inf")
_READ_BUFSIZE = 2**16
# The most of a non-streamed answer held before it is relayed (docs/DECISIONS.md D53): answers up to
# this size keep a retry on another worker (or a clean 502) when their worker breaks off in them.
HOLD_BYTES = 256 * 1024
_ONE_WRITE_MAX = 2**16  # bodies up to this size go out in the same write as the head
_NO_TIMER = TimerNoop()
_USAGE_TAIL = 4096  # of an answer relayed through, the end kept to read its usage from


# How a kept-alive connection the worker closed meets the request written on it: reset by the peer,
# or the write refused. ECONNREFUSED and the rest belong to opening a connection, never a reused one.
_HUNG_UP = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


class _NotSent(aiohttp.ServerDisconnectedError):
    """The connection was closed before the request was written to it (nothing was sent)."""


def _unanswered(exc: BaseException) -> bool:
    """Whether a request on a reused kept-alive connection failed because the worker had closed the
    connection before any of an answer came: it hung up before a byte of an answer was parsed (a
    ServerDisconnectedError holds the partial answer it broke off in, else only its text), or the
    connection was reset or refused the write. A reset after part of an answer counts too (aiohttp
    keeps no trace of the part); a worker resetting mid-answer on a connection it had kept alive
    is the rarer case, and the request goes to it once more."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return isinstance(exc.message, str)
    return isinstance(exc, OSError) and exc.errno in _HUNG_UP


def _header_line(name: str, value: str) -> bytes:
    """``name: value`` and its CRLF, refused when either holds a CR, LF or NUL (``in`` tests of the byte
    values: memchr each; a bytes operand is first tried as an integer, raising and clearing a
    TypeError each time, ~1.9k instructions: D98)."""
    line = f"{name}: {value}".encode("latin-1")
    if 13 in line or 10 in line or 0 in line:
        raise UpstreamFailure(FailureKind.CONNECT, f"header {name} holds a line break")
    return line + b"\r\n"


@dataclass(frozen=True, slots=True)
class _Target:
    """One worker route, prepared once: what the connector pools on, and the request head's fixed
    lines (request line, Host, Content-Type, the worker's key)."""

    probe: aiohttp.ClientRequest  # never sent; names the pool (host, port, TLS) for connector.connect
    head: bytes
    pooled: ConnectionKey  # the idle pool's key


class _IdlePool:
    """Workers' idle keep-alive connections, as aiohttp's connector keeps them: first in first out,
    one past its worker's idle time (:attr:`HttpPool.idle_secs`, held with it as the moment it expires)
    or no longer connected is closed instead of reused, at most the worker's ``max_idle`` kept (more
    closed as they come back), and a sweep at the earliest expiry closes the expired ones. Connections
    kept forever (idle time 0 in the block or the flag: infinity) never schedule the sweep; one the
    worker closed is found closed when taken, and a request that meets its closing (the worker hangs
    up or resets before any of an answer) is sent once more on a new connection (``_resending``). Each
    is the connector's :class:`Connection`, kept (never released to the connector) and closed
    through it. One per event loop (its connections belong to it)."""

    __slots__ = ("_loop", "_idle", "_sweep", "_sweep_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._idle: dict[ConnectionKey, deque[tuple[Connection, float]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = _FOREVER

    def take(self, key: ConnectionKey) -> Connection | None:
        """An idle connection to reuse, or None (the connector opens one)."""
        idle = self._idle.get(key)
        if not idle:
            return None
        now = monotonic()
        while idle:
            conn, expires = idle.popleft()
            protocol = conn.protocol
            if protocol is not None and protocol.is_connected() and now <= expires:
                return conn
            conn.close()
        return None

    def put(self, key: ConnectionKey, conn: Connection, pool: HttpPool) -> None:
        """A connection whose answer was read to its end: kept unless it must close or its worker's
        ``max_idle`` are kept already."""
        protocol = conn.protocol
        if protocol is None or protocol.should_close:
            conn.close()
            return
        idle = self._idle.get(key)
        if idle is None:
            idle = self._idle[key] = deque()
        elif len(idle) >= pool.max_idle:
            conn.close()
            return
        expires = monotonic() + pool.idle_secs
        idle.append((conn, expires))
        if expires < self._sweep_at:  # never for those kept forever; else once per sweep
            self._schedule(expires)

    def _schedule(self, at: float) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = at
        self._sweep = self._loop.call_later(max(0.0, at - monotonic()), self._expire)

    def _expire(self) -> None:
        self._sweep = None
        self._sweep_at = _FOREVER
        due = monotonic() + _SWEEP_SLACK_SECS
        soonest = _FOREVER
        for key, idle in list(self._idle.items()):
            if any(expires <= due or conn.closed for conn, expires in idle):
                kept: deque[tuple[Connection, float]] = deque()
                for conn, expires in idle:
                    if expires <= due or conn.closed:
                        conn.close()
                    else:
                        kept.append((conn, expires))
                idle = kept
                if idle:
                    self._idle[key] = idle
                else:
                    del self._idle[key]
            for _, expires in idle:
                if expires < soonest:
                    soonest = expires
        if soonest < _FOREVER:
            self._schedule(soonest)

    def drain(self) -> list[Connection]:
        """Empty, the sweep stopped: the idle connections, for the session's connector to close (it
        still counts each as its own, closes it and waits until it is closed)."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
            self._sweep_at = _FOREVER
        held = [conn for idle in self._idle.values() for conn, _ in idle]
        self._idle.clear()
        return held


class _Exchange:
    """A request on a pooled connection whose answer's head is read and whose body is not; it goes
    back to the idle ``pool`` under ``key`` by its worker's ``settings``."""

    __slots__ = ("conn", "pool", "key", "payload", "deadline", "settings")

    def __init__(
        self, conn: Connection, pool: _IdlePool, key: ConnectionKey, payload: StreamReader, deadline: _Deadline,
        settings: HttpPool,
    ) -> None:  # fmt: skip
        self.conn = conn
        self.pool = pool
        self.key = key
        self.payload = payload
        self.deadline = deadline
        self.settings = settings

    def finish(self) -> None:
        """Back to the pool when the answer was read to its end (and the worker keeps it alive)."""
        self.deadline.cancel()
        if not self.payload.is_eof():
            self.conn.close()
        else:
            self.pool.put(self.key, self.conn, self.settings)

    def close(self) -> None:
        self.deadline.cancel()
        self.conn.close()


class _H2Exchange:
    """A request on an HTTP/2 stream whose answer's head is read and whose body is not (what
    :class:`_HttpAnswer` reads, as it reads an :class:`_Exchange`): ending it early resets the stream."""

    __slots__ = ("payload", "deadline", "settings")

    def __init__(self, stream: H2Stream, deadline: _Deadline, settings: HttpPool) -> None:
        self.payload = stream
        self.deadline = deadline
        self.settings = settings

    def finish(self) -> None:
        self.deadline.cancel()
        self.payload.cancel()  # nothing when the stream ended

    def close(self) -> None:
        self.deadline.cancel()
        self.payload.cancel()


@dataclass(frozen=True, slots=True)
class _H2Target:
    """One HTTP/2 worker route, prepared once: where to connect, the path, and the fixed header fields."""

    host: str
    port: int
    authority: str
    block: bytes  # the request's header block but for its per-request fields (http2.request_block)


# Connection-specific fields HTTP/2 forbids (RFC 9113 8.2.2): never forwarded to an HTTP/2 worker.
_H2_DROPPED = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "host"})


_H2_ACCEPT_SSE = literal("accept", "text/event-stream")


def _h2_field(name: str, value: str) -> tuple[str, str]:
    """A header field for HTTP/2 (lowercase name), refused as :func:`_header_line` refuses it."""
    _header_line(name, value)
    return name.lower(), value


@RELAYS.register(Transport.HTTP)
class HttpRelay(Relay):
    transport = Transport.HTTP
    # How a stream the gateway asked usage of (RelayRequest.added_usage) is read (D66, D80).
    asked_usage_scan: type[StreamUsage] = StreamUsage

    @classmethod
    def from_config(cls, config: GatewayConfig) -> HttpRelay:
        return cls(
            config.request_timeout_secs, config.upstream_pool_idle_timeout_secs,
            max_answer_bytes=config.max_buffered_response_bytes,
        )  # fmt: skip

    def __init__(
        self, request_timeout_secs: float, keepalive_secs: float = KEEPALIVE_SECS, max_answer_bytes: int = 2**28
    ) -> None:
        self._keepalive_secs = keepalive_secs
        self.max_answer_bytes = max_answer_bytes
        # A non-streamed answer up to this size is read whole before it is relayed; longer, through.
        self.hold_bytes = min(max_answer_bytes, HOLD_BYTES)
        self._request_timeout_secs = request_timeout_secs
        # A worker without an http_pool block of its own (WorkerRecord.http_pool None): the flags'.
        self.defaults = HttpPool(
            _MAX_IDLE, keepalive_secs if keepalive_secs > 0 else _FOREVER, request_timeout_secs, _CONNECT_TIMEOUT_SECS
        )
        self._timeout = self._client_timeout(self.defaults)
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {_CONNECT_TIMEOUT_SECS: self._timeout}
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._pools: dict[asyncio.AbstractEventLoop, _IdlePool] = {}
        self._targets: dict[tuple[str, str, str | None], _Target] = {}
        self._h2_pools: dict[asyncio.AbstractEventLoop, H2Pool] = {}
        self._h2_targets: dict[tuple[str, str, str | None], _H2Target] = {}

    def session(self, loop: asyncio.AbstractEventLoop | None = None) -> aiohttp.ClientSession:
        """This loop's session (``loop``: the running one, when the caller has it already)."""
        if loop is None:
            loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            # No connection cap: a long stream holds its connection for minutes, and a cap would make
            # request N+1 wait for the connect timeout and fail. --max-concurrent-requests is the limit.
            connector = self._connector()
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # a relay keeps no cookies
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                read_bufsize=_READ_BUFSIZE,
            )
            self._sessions[loop] = session
            stale = self._pools.get(loop)
            for conn in stale.drain() if stale is not None else ():
                conn.close()
            self._pools[loop] = _IdlePool(loop)
        return session

    def _client_timeout(self, settings: HttpPool) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=self._request_timeout_secs, connect=settings.connect_secs, sock_connect=settings.connect_secs
        )

    def _connect_timeout(self, settings: HttpPool) -> aiohttp.ClientTimeout:
        """The connector's timeouts for opening a connection to a worker of these settings (its
        connect_timeout_secs; a new connection only, one object per value)."""
        timeout = self._timeouts.get(settings.connect_secs)
        if timeout is None:
            timeout = self._timeouts[settings.connect_secs] = self._client_timeout(settings)
        return timeout

    def _connector(self) -> aiohttp.TCPConnector:
        # Idle connections are the idle pool's, never released to the connector.
        return aiohttp.TCPConnector(
            limit=0, limit_per_host=0, keepalive_timeout=self._keepalive_secs or None, enable_cleanup_closed=True,
            ssl=tls_context(),  # https:// workers: the CA bundles and client chain of common/tls.py
        )

    def _key_lines(self, provider: str | None, api_key: str | None) -> bytes:
        """The head lines that present the worker's key (``provider``: an external worker's)."""
        return _header_line("Authorization", f"Bearer {api_key}") if api_key else b""

    def _caller_key_lines(self, request: RelayRequest) -> bytes:
        """Head lines presenting the caller's own key (external providers only)."""
        return b""

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        pool = self._pools.pop(loop, None)
        held = pool.drain() if pool is not None else []
        h2 = self._h2_pools.pop(loop, None)
        if h2 is not None:
            h2.close()
        if session is not None:
            await session.close()
        for conn in held:
            conn.close()  # closed with the connector: only let go of

    def _target(self, record: WorkerRecord, path: str) -> _Target:
        """The prepared route (URL parsing and the fixed head lines are a visible share of a relay)."""
        base = record.url
        api_key = record.api_key
        key = (base, path, api_key)
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) > 4096:
                self._targets.clear()
            url = URL(base.rstrip("/") + path)
            if url.scheme not in ("http", "https") or not url.host:
                raise UpstreamFailure(FailureKind.CONNECT, f"not an HTTP worker URL: {base}")
            head = b"POST " + url.raw_path_qs.encode("ascii") + b" HTTP/1.1\r\n"
            head += _header_line("Host", url.host_port_subcomponent or url.host)
            head += b"Content-Type: application/json\r\n"
            head += self._key_lines(record.provider, api_key)
            probe = aiohttp.ClientRequest("POST", url, loop=asyncio.get_running_loop(), ssl=True)
            target = self._targets[key] = _Target(probe, head, probe.connection_key)
        return target

    def _head(self, target: _Target, request: RelayRequest) -> bytes:
        parts = [target.head, b"Content-Length: %d\r\nX-Request-ID: " % len(request.body), request.request_id, b"\r\n"]
        if request.stream:
            parts.append(b"Accept: text/event-stream\r\n")
        for name, value in request.headers:
            parts.append(_header_line(name, value))
        if request.caller_key is not None:
            parts.append(self._caller_key_lines(request))
        parts.append(b"\r\n")
        return b"".join(parts)

    def _failure(self, exc: BaseException, connect_secs: float = _CONNECT_TIMEOUT_SECS) -> UpstreamFailure:
        if isinstance(exc, aiohttp.ClientConnectorError):
            return UpstreamFailure(FailureKind.CONNECT, f"cannot connect to {exc.host}:{exc.port}")
        if isinstance(exc, asyncio.TimeoutError):
            return UpstreamFailure(FailureKind.CONNECT, f"no connection within {connect_secs:g} seconds")
        if isinstance(exc, aiohttp.ClientError):
            return UpstreamFailure(FailureKind.BROKEN, type(exc).__name__)
        return UpstreamFailure(FailureKind.BROKEN, f"{type(exc).__name__}: {exc}")

    def _timed_out(self, seconds: float) -> UpstreamFailure:
        return UpstreamFailure(FailureKind.TIMEOUT, "timed out", seconds)

    async def open(self, request: RelayRequest) -> RelayAnswer:
        record = request.worker.record
        if record.http2:
            return await self._open_h2(request, record)
        target = self._target(record, request.path)
        head = self._head(target, request)
        settings = record.http_pool or self.defaults  # the worker's http_pool block (D102)
        # Asked once: on Python 3.11 each get_running_loop() or current_task() without a loop is a
        # getpid() system call (issue 27, D86).
        loop = asyncio.get_running_loop()
        session = self.session(loop)
        key = target.pooled
        pool = self._pools[loop]
        deadline = _Deadline(loop, settings.timeout_secs)
        conn: Connection | None = pool.take(key)
        resent = False
        while True:
            try:
                if conn is None:
                    connector = session.connector
                    assert connector is not None
                    conn = await connector.connect(target.probe, traces=[], timeout=self._connect_timeout(settings))
                    fresh = True
                else:
                    fresh = False
                protocol: ResponseHandler | None = conn.protocol
                transport = conn.transport
                if protocol is None or transport is None:
                    raise aiohttp.ServerDisconnectedError() if resent else _NotSent()
                if fresh:
                    # A connection from the idle pool keeps the parser of its last answer, read to its
                    # end with these same settings, which reads the next (llhttp, keep-alive): a new
                    # parser per request was ~6 us of C (issue 27, D86).
                    protocol.set_response_params(
                        timer=_NO_TIMER, auto_decompress=False, read_bufsize=_READ_BUFSIZE, read_until_eof=True
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
                    raise self._timed_out(settings.timeout_secs) from None
                raise
            except (aiohttp.ClientError, HttpProcessingError, OSError, asyncio.TimeoutError) as exc:
                if conn is not None:
                    conn.close()
                    # ``fresh`` is set whenever ``conn`` is: a pooled one the worker closed before
                    # answering, or any one closed before the request was written
                    if not resent and ((not fresh and _unanswered(exc)) or type(exc) is _NotSent):
                        resent = True
                        self._resending(request, "connection closed before any answer")
                        conn = None
                        continue
                deadline.cancel()
                raise self._failure(exc, settings.connect_secs) from None
            except BaseException:
                if conn is not None:
                    conn.close()
                deadline.cancel()
                raise
            break
        headers = message.headers
        return _HttpAnswer(
            self, request, message.code, headers.get("Content-Type", ""), headers.get("Content-Length"),
            _Exchange(conn, pool, key, payload, deadline, settings),
        )

    def _resending(self, request: RelayRequest, why: str) -> None:
        """The request goes again, once, on a new connection: the kept-alive one it was written on was
        closed by the worker before any byte of an answer came back (the worker closing an idle
        connection as the request went out, or a worker restarted since), or the connection was
        closed before the request was written at all; or an HTTP/2 stream the worker did not process.
        Not an attempt of the retry policy and not the worker's failure: the attempts loop sees only
        the second send's outcome, within the same deadline. Counted in
        gw_router_upstream_send_retries_total (spec 3); ``why`` goes in the log line."""
        _add(UPSTREAM_SEND_RETRIES, request.worker.record.transport)(1)
        log.info("%s to %s; sending the request again", why, request.worker.url)

    def _h2_target(self, record: WorkerRecord, path: str) -> _H2Target:
        base = record.url
        api_key = record.api_key
        key = (base, path, api_key)
        target = self._h2_targets.get(key)
        if target is None:
            if len(self._h2_targets) > 4096:
                self._h2_targets.clear()
            url = URL(base.rstrip("/") + path)
            if url.scheme != "http" or not url.host or url.port is None:
                raise UpstreamFailure(FailureKind.CONNECT, f"not an HTTP/2 (h2c) worker URL: {base}")
            fields = [("content-type", "application/json")]
            if api_key:
                fields.append(_h2_field("authorization", f"Bearer {api_key}"))
            authority = url.host_port_subcomponent or url.host
            block = request_block(url.raw_path_qs, authority, fields)
            target = self._h2_targets[key] = _H2Target(url.host, url.port, authority, block)
        return target

    async def _open_h2(self, request: RelayRequest, record: WorkerRecord) -> RelayAnswer:
        """The request on an HTTP/2 stream (D111); the answer as :meth:`open` gives an HTTP/1.1 one."""
        target = self._h2_target(record, request.path)
        body = request.body
        parts = [
            target.block, literal("content-length", str(len(body))),
            literal("x-request-id", request.request_id.decode("latin-1")),
        ]  # fmt: skip
        if request.stream:
            parts.append(_H2_ACCEPT_SSE)
        for name, value in request.headers:
            if name.lower() not in _H2_DROPPED:
                parts.append(literal(*_h2_field(name, value)))
        settings = record.http_pool or self.defaults
        loop = asyncio.get_running_loop()
        pool = self._h2_pools.get(loop)
        if pool is None:
            pool = self._h2_pools[loop] = H2Pool()
        deadline = _Deadline(loop, settings.timeout_secs)
        block = b"".join(parts)
        resent = False
        while True:
            stream: H2Stream | None = None
            try:
                try:
                    connection = await pool.connection(
                        target.host, target.port, target.authority, settings.idle_secs, settings.connect_secs
                    )
                except (OSError, asyncio.TimeoutError) as exc:
                    if isinstance(exc, asyncio.TimeoutError):
                        raise UpstreamFailure(
                            FailureKind.CONNECT, f"no connection within {settings.connect_secs:g} seconds"
                        ) from None
                    raise UpstreamFailure(
                        FailureKind.CONNECT, f"cannot connect to {target.host}:{target.port}"
                    ) from None
                stream = connection.start(block, body)
                await stream.head()
            except asyncio.CancelledError:
                if stream is not None:
                    stream.cancel()
                deadline.cancel()
                if deadline.absorb():
                    raise self._timed_out(settings.timeout_secs) from None
                raise
            except aiohttp.ClientError as exc:
                if stream is not None:
                    stream.cancel()
                # Not processed (:class:`StreamRefused`: a GOAWAY that excluded it, REFUSED_STREAM, a
                # connection that closed as it was handed out): once more, on a connection not going
                # away, as an HTTP/1.1 request is resent (:meth:`_resending`).
                if not resent and isinstance(exc, StreamRefused):
                    resent = True
                    self._resending(request, f"HTTP/2 stream not processed ({exc})")
                    continue
                deadline.cancel()
                raise self._failure(exc, settings.connect_secs) from None
            except BaseException:
                if stream is not None:
                    stream.cancel()
                deadline.cancel()
                raise
            break
        headers = stream.headers
        return _HttpAnswer(
            self, request, stream.status, headers.get("content-type", ""), headers.get("content-length"),
            _H2Exchange(stream, deadline, settings),
        )


class _HttpAnswer(RelayAnswer):
    """An HTTP worker's answer: its head is read, its body waits on the pooled connection."""

    __slots__ = ("_relay", "_request", "_exchange", "_declared", "_writer", "_scan")

    def __init__(
        self, relay: HttpRelay, request: RelayRequest, status: int, content_type: str, declared: str | None,
        exchange: _Exchange | _H2Exchange,
    ) -> None:
        super().__init__(status, content_type)
        self._relay = relay
        self._request = request
        self._exchange = exchange
        self._declared = declared  # the answer's Content-Length, as sent

    async def discard(self) -> None:
        self._exchange.close()

    async def forward(self, writer: ResponseWriter) -> Delivered:
        exchange = self._exchange
        try:
            if self._request.stream and self.status == 200 and self.content_type.startswith("text/event-stream"):
                delivered = await self._relay_stream(writer)
            else:
                usage = await self._relay_whole(writer)
                delivered = CLEAN if usage is None else Delivered(True, usage)
        except BaseException:
            # Cancelled (client gone), timed out or failed: drop the upstream connection.
            exchange.close()
            raise
        exchange.finish()
        return delivered

    async def chunks(self) -> AsyncIterator[bytes]:
        exchange = self._exchange
        payload = exchange.payload
        whole = False
        try:
            while chunk := await payload.readany():
                yield chunk
            whole = True
        except asyncio.CancelledError:
            if exchange.deadline.absorb():
                raise self._relay._timed_out(exchange.settings.timeout_secs) from None
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._relay._failure(exc) from None
        finally:
            if whole:
                exchange.finish()
            else:
                exchange.close()

    async def _relay_whole(self, writer: ResponseWriter) -> TokenUsage | None:
        """A non-streamed answer, and the usage it reported (a 200's). One of up to ``hold_bytes`` is read whole before anything goes to
        the client: a worker that breaks off in it fails the attempt (502, or another worker). A
        longer one (declared, or found so while reading) is relayed through as it arrives, never
        held whole (D53): memory stays at one read per request whatever the worker sends."""
        exchange = self._exchange
        payload = exchange.payload
        window = self._relay.hold_bytes
        declared = int(self._declared) if self._declared is not None and self._declared.isdigit() else None
        reading = perf_counter()
        held: list[bytes] = []
        size = 0
        try:
            if declared is None or declared <= window:
                while chunk := await payload.readany():
                    held.append(chunk)
                    size += len(chunk)
                    if size > window:
                        break
        except asyncio.CancelledError:
            if exchange.deadline.absorb():
                raise self._relay._timed_out(exchange.settings.timeout_secs) from None
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._relay._failure(exc) from None
        content_type = self.content_type.encode("latin-1")
        accounted = self.status == 200
        if size <= window and (declared is None or declared <= window):
            body = held[0] if len(held) == 1 else b"".join(held)
            await writer.whole(self.status, content_type, body, perf_counter() - reading)
            return usage_in_body(body, usage_key(self._request.path)) if accounted else None
        await writer.open_whole(self.status, content_type, declared, perf_counter() - reading)
        tail = b""
        for chunk in held:
            await writer.part(chunk)
        if held:
            tail = held[-1][-_USAGE_TAIL:]
        del held
        try:
            while chunk := await payload.readany():
                await writer.part(chunk)
                tail = chunk[-_USAGE_TAIL:] if len(chunk) >= _USAGE_TAIL else (tail + chunk)[-_USAGE_TAIL:]
        except asyncio.CancelledError:
            if not exchange.deadline.absorb():
                raise
            failure = self._relay._timed_out(exchange.settings.timeout_secs)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            failure = self._relay._failure(exc)
        else:
            await writer.end_whole()
            return usage_in_body(tail, usage_key(self._request.path)) if accounted else None
        log.warning("answer from %s broke off after the response started: %s", self._request.worker.url, failure.detail)
        writer.abort(failure.detail)

    async def _relay_stream(self, writer: ResponseWriter) -> Delivered:
        """The stream as it arrives, its usage read on the way (:class:`StreamUsage`)."""
        exchange = self._exchange
        request = self._request
        scan = (self._relay.asked_usage_scan if request.added_usage else StreamUsage)(
            usage_key(request.path), request.added_usage
        )
        await writer.open_stream()
        # The client leaving before the worker's usage came: what the stream came to so far (D80).
        self._writer = writer
        self._scan = scan
        writer.usage_so_far = self._so_far
        payload = exchange.payload
        try:
            while True:
                chunk = await payload.readany()
                if not chunk:
                    break
                sent = scan.feed(chunk)
                if payload.is_eof():
                    # The worker's stream ended with this chunk: it goes out as the last body message.
                    await writer.chunk(sent + scan.end(), last=True)
                    writer.usage_so_far = None  # the stream ended (and the cycle through it with it)
                    usage = scan.usage()
                    return Delivered(True, usage if usage is not None else self._estimate(writer, scan, True))
                if sent:
                    await writer.chunk(sent)
        except asyncio.CancelledError:
            if not exchange.deadline.absorb():
                raise
            return await self._broken(writer, self._relay._timed_out(exchange.settings.timeout_secs), scan)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return await self._broken(writer, self._relay._failure(exc), scan)
        rest = scan.end()
        if rest:
            await writer.chunk(rest)
        await writer.end_stream()
        writer.usage_so_far = None
        usage = scan.usage()
        return Delivered(True, usage if usage is not None else self._estimate(writer, scan, True))

    def _estimate(self, writer: ResponseWriter, scan: StreamUsage, ended: bool = False) -> TokenUsage:
        """The stream's usage without the worker's final word (D80): estimated from what went out;
        ``ended``: the stream ended in full without reporting any."""
        return stream_estimate(self._request.path, self._request.body, writer.events, scan.usage(), ended)

    def _so_far(self) -> TokenUsage:
        """The writer's reader of the usage so far, for a client that leaves the stream (D80)."""
        return self._estimate(self._writer, self._scan)

    async def _broken(self, writer: ResponseWriter, failure: UpstreamFailure, scan: StreamUsage) -> Delivered:
        """The response has started: the writer reports the failure in-band and ends the stream."""
        log.warning("upstream stream from %s failed: %s", self._request.worker.url, failure.detail)
        rest = scan.end()
        if rest:
            await writer.chunk(rest)
        await writer.break_stream(failure.in_band())
        writer.usage_so_far = None
        return Delivered(False, self._estimate(writer, scan))

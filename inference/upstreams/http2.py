"""HTTP workers over HTTP/2 with prior knowledge (h2c: ``http://`` workers whose http_pool.http2 is
on, or found speaking it under --upstream-http2; docs/DECISIONS.md D111). The HTTP relay
(:mod:`inference.upstreams.http`) sends such a worker's request here and reads the answer through the
same code as an HTTP/1.1 one: a stream here looks like aiohttp's payload reader (``readany``,
``is_eof``), and a broken one raises aiohttp's ``ClientPayloadError``, so streaming, the held
window of a whole answer, the usage scan, timeouts and in-band errors are the HTTP/1.1 relay's.

What the client does (RFC 9113), and no more:

- the client preface without upgrade, push disabled, TCP_NODELAY; one connection per worker and
  event loop, another only while the worker's SETTINGS_MAX_CONCURRENT_STREAMS fills the ones open;
  a connection idle past the worker's ``pool_idle_timeout_secs`` is closed and replaced rather than
  trusted (a server closing an idle connection races a request written on it, as on HTTP/1.1);
- flow control both ways: each stream's receive window is :data:`STREAM_WINDOW`, given back only as
  the relay reads what arrived, so a client that stops reading stops the worker's stream at one
  window; the connection's window is as large as HTTP/2 allows; the request body waits for the
  peer's windows (WINDOW_UPDATE, SETTINGS_INITIAL_WINDOW_SIZE);
- HEADERS/CONTINUATION through one HPACK encoder and decoder per connection, SETTINGS acknowledged,
  PING answered, GOAWAY honoured (streams past its last id fail, no new streams), RST_STREAM;
- cancelling (the client left, or the deadline) sends RST_STREAM CANCEL for the stream only.

Not done: HTTP/2 over TLS (``https://`` workers stay on HTTP/1.1: ALPN on the shared TLS context
would change what aiohttp negotiates), server push, priorities, trailers (read and dropped).
:func:`speaks_http2` is registration's probe: the preface and a SETTINGS frame back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
import time
from typing import Iterable

import aiohttp
import hpack

__all__ = ["H2Pool", "H2Stream", "STREAM_WINDOW", "StreamRefused", "literal", "request_block", "speaks_http2"]

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_CANCEL = 0x8
_MAX_WINDOW = 2**31 - 1
_REOPEN_AFTER = 2**30
_DEFAULT_WINDOW = 65_535
_DEFAULT_FRAME = 16_384
_MAX_HEADER_BLOCK = 1 << 20
_FRAME_HEAD = struct.Struct(">IBI")
_SETTING = struct.Struct(">HI")
# Each stream's receive window: what the worker may send ahead of the relay's reads (the HTTP/1.1
# relay reads 64 KiB at a time off a socket whose kernel buffers hold a few hundred more).
STREAM_WINDOW = 256 * 1024
_CREDIT_AFTER = STREAM_WINDOW // 4


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """HPACK's integer (RFC 7541 5.1) after ``first``'s flag bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A field as HPACK's literal without indexing, new name, no Huffman (RFC 7541 6.2.2): the
    requests' fields never enter the peer's dynamic table, so a request's block needs no encoder state
    and its fixed part is made once per route (hpack's encoder cost a tenth of a relay)."""
    raw_name = name.encode("latin-1")
    raw_value = value.encode("latin-1")
    return b"\x00" + _hpack_int(len(raw_name), 7, 0) + raw_name + _hpack_int(len(raw_value), 7, 0) + raw_value


literal = _literal


def request_block(path: str, authority: str, fields: Iterable[tuple[str, str]], scheme: str = "http") -> bytes:
    """The fixed part of a POST's header block: :method POST and :scheme from the static table, the
    rest as literals (:func:`_literal`); more fields may follow it as literals."""
    head = b"\x83" + (b"\x86" if scheme == "http" else b"\x87")  # :method POST, :scheme http / https
    return head + _literal(":path", path) + _literal(":authority", authority) + b"".join(
        _literal(name, value) for name, value in fields
    )


class StreamRefused(aiohttp.ClientPayloadError):
    """The worker did not process the stream, so it may be sent again (RFC 9113 8.7): a GOAWAY's last
    stream id excluded it, or it was reset with REFUSED_STREAM."""


_REFUSED_STREAM = 0x7


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload) << 8 | kind).to_bytes(4, "big") + bytes((flags,)) + stream_id.to_bytes(4, "big") + payload


class H2Stream:
    """One request's stream: its answer's head (``status``, ``headers``) once :meth:`head` returns,
    then its body through :meth:`readany` as aiohttp's payload reader gives it."""

    __slots__ = (
        "_connection", "stream_id", "status", "headers", "_chunks", "_waiter", "error", "ended", "_pending",
        "send_window", "_block", "_block_end", "_uncredited", "_head_seen",
    )  # fmt: skip

    def __init__(self, connection: H2Connection, stream_id: int) -> None:
        self._connection = connection
        self.stream_id = stream_id
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self.error: Exception | None = None
        self.ended = False  # the peer ended the stream, or it failed
        self._pending = b""
        self.send_window = connection.peer_initial_window
        self._block = bytearray()
        self._block_end = False
        self._uncredited = 0
        self._head_seen = False

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def head(self) -> None:
        """Wait for the answer's final head (1xx heads are skipped). Raises ClientPayloadError."""
        while not self._head_seen:
            if self.ended:
                raise self.error or aiohttp.ClientPayloadError("the stream ended without an answer")
            await self._wait()

    async def readany(self) -> bytes:
        """What arrived of the body (waiting for some), b"" at its end. Raises ClientPayloadError
        when the stream broke off."""
        while not self._chunks:
            if self.ended:
                if self.error is not None:
                    raise self.error
                return b""
            await self._wait()
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._uncredited += len(data)
        if self._uncredited >= _CREDIT_AFTER and not self.ended:
            self._connection.credit(self.stream_id, self._uncredited)
            self._uncredited = 0
        return data

    def is_eof(self) -> bool:
        """The body was read to its end (the peer ended the stream, nothing is left unread)."""
        return self.ended and self.error is None and not self._chunks

    def cancel(self) -> None:
        """RST_STREAM CANCEL, unless the stream ended already."""
        if not self.ended:
            self._finish(aiohttp.ClientPayloadError("cancelled"))
            self._connection.reset(self.stream_id)

    # -- fed by the connection ---------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _finish(self, error: Exception | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.error = error
        self._connection.forget(self.stream_id)
        self._wake()

    def _data(self, payload: bytes, end_stream: bool) -> None:
        if payload:
            self._chunks.append(payload)
        if end_stream:
            self._finish(None)
        else:
            self._wake()

    def _header_block(self, headers: list[tuple[str, str]], end_stream: bool) -> None:
        if not self._head_seen:
            fields = dict(headers)
            status = fields.get(":status", "")
            if not status.isdigit():
                self._finish(aiohttp.ClientPayloadError("an answer without a status"))
                self._connection.reset(self.stream_id)
                return
            code = int(status)
            if 100 <= code <= 199:
                return  # informational: the final head follows
            self.status = code
            self.headers = fields
            self._head_seen = True
        # else trailers: dropped
        if end_stream:
            self._finish(None)
        else:
            self._wake()


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection to one worker."""

    def __init__(self, authority: str, scheme: str) -> None:
        self.authority = authority
        self.scheme = scheme
        self.peer_max_streams = 2**31
        self.idle_since = time.monotonic()
        self.transport: asyncio.Transport | None = None
        self._decoder = hpack.Decoder()
        self._decoder.max_allowed_table_size = 1 << 16
        self.streams: dict[int, H2Stream] = {}
        self._next_id = 1
        self._buffer = b""
        self.send_window = _DEFAULT_WINDOW
        self.peer_initial_window = _DEFAULT_WINDOW
        self._peer_frame = _DEFAULT_FRAME
        self._consumed = 0
        self._blocked: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._continuing: int | None = None
        self._orphan_block = bytearray()
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.failed: Exception | None = None
        self.going_away = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        settings = _SETTING.pack(2, 0) + _SETTING.pack(4, STREAM_WINDOW)  # ENABLE_PUSH 0, INITIAL_WINDOW_SIZE
        transport.write(  # type: ignore[attr-defined]
            _PREFACE + _frame(_SETTINGS, 0, 0, settings)
            + _frame(_WINDOW_UPDATE, 0, 0, (_MAX_WINDOW - _DEFAULT_WINDOW).to_bytes(4, "big"))
        )  # fmt: skip

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"the connection was lost ({exc})" if exc else "the connection was closed")

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        if not self.settled.done() and buffer[:5] == b"HTTP/":  # an HTTP/1.x answer to the preface
            line = bytes(buffer.split(b"\r\n", 1)[0][:80]).decode("latin-1")
            self._fail(f"it answered the HTTP/2 preface in HTTP/1 ({line})")
            if self.transport is not None:
                self.transport.close()
            return
        start = 0
        size = len(buffer)
        while size - start >= 9:
            head, flags, stream_id = _FRAME_HEAD.unpack_from(buffer, start)
            length = head >> 8
            if length > _DEFAULT_FRAME:  # past the SETTINGS_MAX_FRAME_SIZE we keep (the default)
                self._protocol_error(f"a frame of {length} bytes")
                return
            end = start + 9 + length
            if end > size:
                break
            payload = buffer[start + 9 : end]
            start = end
            self._frame(head & 0xFF, flags, stream_id & 0x7FFFFFFF, payload)
            if self.failed is not None:
                return
        self._buffer = buffer[start:] if start < size else b""

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is not None and kind != _CONTINUATION:
            self._protocol_error("a header block was interrupted")
            return
        if kind == _DATA:
            self._consumed += len(payload)
            if self._consumed >= _REOPEN_AFTER and self.transport is not None:
                self.transport.write(_frame(_WINDOW_UPDATE, 0, 0, self._consumed.to_bytes(4, "big")))
                self._consumed = 0
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if flags & _PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            stream._data(payload, bool(flags & _END_STREAM))
        elif kind == _HEADERS:
            if flags & _PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & _PRIORITY:
                payload = payload[5:]
            stream = self.streams.get(stream_id)
            block = stream._block if stream is not None else self._orphan_block
            block[:] = payload
            if stream is not None:
                stream._block_end = bool(flags & _END_STREAM)
            if flags & _END_HEADERS:
                self._end_block(stream_id, block, bool(flags & _END_STREAM))
            else:
                self._continuing = stream_id
        elif kind == _CONTINUATION:
            if self._continuing != stream_id:
                self._protocol_error("an unexpected CONTINUATION frame")
                return
            stream = self.streams.get(stream_id)
            block = stream._block if stream is not None else self._orphan_block
            block += payload
            if len(block) > _MAX_HEADER_BLOCK:
                self._protocol_error("a header block is too large")
                return
            if flags & _END_HEADERS:
                self._continuing = None
                self._end_block(stream_id, block, stream._block_end if stream is not None else False)
        elif kind == _WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
            else:
                stream = self.streams.get(stream_id)
                if stream is None:
                    return
                stream.send_window += increment
            self._flush_blocked()
        elif kind == _SETTINGS:
            if not flags & _ACK:
                self._settings(payload)
        elif kind == _PING:
            if not flags & _ACK and self.transport is not None:
                self.transport.write(_frame(_PING, _ACK, 0, bytes(payload)))
        elif kind == _RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                code = int.from_bytes(payload[:4], "big")
                failed = StreamRefused if code == _REFUSED_STREAM else aiohttp.ClientPayloadError
                stream._finish(failed(f"the stream was reset (HTTP/2 error {code})"))
        elif kind == _GOAWAY:
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self.going_away = True
            for number, stream in list(self.streams.items()):
                if number > last:
                    stream._finish(StreamRefused("the worker is going away"))
        # PRIORITY, PUSH_PROMISE (push is off) and unknown frame types are ignored

    def _settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - len(payload) % 6, 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == 4:  # (HEADER_TABLE_SIZE: our requests never index, the peer's table stays empty)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == 5:
                self._peer_frame = value
            elif key == 3:
                self.peer_max_streams = value
        if self.transport is not None:
            self.transport.write(_frame(_SETTINGS, _ACK, 0))
        if not self.settled.done():
            self.settled.set_result(None)
        self._flush_blocked()

    def _end_block(self, stream_id: int, block: bytearray, end_stream: bool) -> None:
        try:
            headers = self._decoder.decode(bytes(block))  # always, to keep the dynamic table in step
        except hpack.HPACKError as exc:
            self._protocol_error(f"a header block did not decode ({exc})")
            return
        block.clear()
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream._header_block([(str(name), str(value)) for name, value in headers], end_stream)

    def _protocol_error(self, reason: str) -> None:
        if self.transport is not None:
            self.transport.write(_frame(_GOAWAY, 0, 0, (0).to_bytes(4, "big") + (1).to_bytes(4, "big")))
            self.transport.close()
        self._fail(f"HTTP/2 protocol error: {reason}")

    def _fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = aiohttp.ClientPayloadError(reason)
        if not self.settled.done():
            self.settled.set_exception(self.failed)
            self.settled.exception()  # retrieved: a connection that never settled needs no warning
        for stream in list(self.streams.values()):
            stream._finish(self.failed)

    # -- requests ------------------------------------------------------------------------------------

    def usable(self, idle_secs: float) -> bool:
        """Open, not going away, with stream ids left, and not idle past ``idle_secs``."""
        if self.failed is not None or self.going_away or self._next_id >= 2**31 - 2:
            return False
        return bool(self.streams) or time.monotonic() - self.idle_since < idle_secs

    @property
    def has_room(self) -> bool:
        return len(self.streams) < self.peer_max_streams

    def credit(self, stream_id: int, size: int) -> None:
        if self.transport is not None and self.failed is None:
            self.transport.write(_frame(_WINDOW_UPDATE, 0, stream_id, size.to_bytes(4, "big")))

    def start(self, block: bytes, body: bytes) -> H2Stream:
        """Open a stream: the request's header ``block`` (:func:`request_block` and more literals)
        and its body, as far as the windows allow."""
        assert self.transport is not None
        stream_id = self._next_id
        self._next_id += 2
        stream = H2Stream(self, stream_id)
        self.streams[stream_id] = stream
        if self.failed is not None or self.going_away:  # since the pool handed it out: nothing is sent
            why = self.failed or "going away"
            stream._finish(StreamRefused(f"the connection closed before the stream went out ({why})"))
            return stream
        frames = bytearray()
        limit = self._peer_frame
        first, rest = block[:limit], block[limit:]
        end = 0 if body else _END_STREAM
        frames += _frame(_HEADERS, end | (0 if rest else _END_HEADERS), stream_id, first)
        while rest:
            piece, rest = rest[:limit], rest[limit:]
            frames += _frame(_CONTINUATION, 0 if rest else _END_HEADERS, stream_id, piece)
        stream._pending = body
        if body:
            self._send_pending(stream, bytes(frames))
        else:
            self.transport.write(bytes(frames))
        return stream

    def _send_pending(self, stream: H2Stream, before: bytes = b"") -> None:
        assert self.transport is not None
        pending = stream._pending
        frames = [before] if before else []
        while pending:
            size = min(len(pending), self.send_window, stream.send_window, self._peer_frame)
            if size <= 0:
                break
            piece, pending = pending[:size], pending[size:]
            self.send_window -= size
            stream.send_window -= size
            frames.append(_frame(_DATA, 0 if pending else _END_STREAM, stream.stream_id, piece))
        stream._pending = pending
        if frames:
            self.transport.write(b"".join(frames))
        if pending:
            self._blocked[stream.stream_id] = None
        else:
            self._blocked.pop(stream.stream_id, None)

    def _flush_blocked(self) -> None:
        for stream_id in list(self._blocked):
            stream = self.streams.get(stream_id)
            if stream is None:
                self._blocked.pop(stream_id, None)
                continue
            self._send_pending(stream)
            if self.send_window <= 0:
                return

    def reset(self, stream_id: int) -> None:
        self.forget(stream_id)
        if self.transport is not None and self.failed is None:
            self.transport.write(_frame(_RST_STREAM, 0, stream_id, _CANCEL.to_bytes(4, "big")))

    def forget(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)
        self._blocked.pop(stream_id, None)
        if not self.streams:
            self.idle_since = time.monotonic()
            if self.going_away and self.transport is not None:
                self.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class H2Pool:
    """The HTTP/2 connections of one event loop, per worker (host, port): one, opened on first use,
    more only while the worker's SETTINGS_MAX_CONCURRENT_STREAMS fills them; one that failed, goes
    away or sat idle past the worker's idle time is closed and replaced."""

    def __init__(self) -> None:
        self._connections: dict[tuple[str, int], list[H2Connection]] = {}
        self._connecting: dict[tuple[str, int], asyncio.Future[H2Connection]] = {}

    async def connection(self, host: str, port: int, authority: str, idle_secs: float, connect_secs: float) -> H2Connection:
        key = (host, port)
        found: H2Connection | None = None
        held = self._connections.get(key)
        if held:
            live = []
            for connection in held:
                if connection.usable(idle_secs):
                    live.append(connection)
                    if found is None and connection.has_room:
                        found = connection
                elif not connection.streams:
                    connection.close()
                else:
                    live.append(connection)  # still serving its streams; no new ones
            self._connections[key] = live
            if found is not None:
                return found
        connecting = self._connecting.get(key)
        if connecting is None:
            connecting = self._connecting[key] = asyncio.ensure_future(
                self._connect(key, authority, connect_secs)
            )
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting.get(key) is connecting:
                del self._connecting[key]

    async def _connect(self, key: tuple[str, int], authority: str, connect_secs: float) -> H2Connection:
        connection = await open_connection(key[0], key[1], authority, connect_secs)
        self._connections.setdefault(key, []).append(connection)
        return connection

    def close(self) -> None:
        for held in self._connections.values():
            for connection in held:
                connection.close()
        self._connections.clear()


async def open_connection(host: str, port: int, authority: str, connect_secs: float) -> H2Connection:
    """A new connection whose peer's SETTINGS arrived. Raises OSError or TimeoutError when it cannot
    connect, ClientPayloadError when the peer does not speak HTTP/2."""
    loop = asyncio.get_running_loop()
    transport: asyncio.BaseTransport | None = None
    try:
        async with asyncio.timeout(connect_secs):
            transport, protocol = await loop.create_connection(lambda: H2Connection(authority, "http"), host, port)
            await protocol.settled
    except BaseException:
        if transport is not None:
            transport.close()
        raise
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return protocol


async def speaks_http2(host: str, port: int, timeout_secs: float) -> str | None:
    """Registration's probe: None when the worker answers the HTTP/2 preface with its SETTINGS (it
    speaks HTTP/2 with prior knowledge), else why not. Raises OSError or TimeoutError when it
    cannot be reached at all."""
    try:
        connection = await open_connection(host, port, f"{host}:{port}", timeout_secs)
    except aiohttp.ClientPayloadError as exc:
        return f"no HTTP/2 with prior knowledge: {exc}"
    except TimeoutError:
        return f"it did not answer the HTTP/2 preface within {timeout_secs:g} s"
    connection.close()
    return None

"""Server-streaming gRPC calls read on the event loop itself: a small HTTP/2 client over plaintext TCP
(``grpc://``), one connection per worker, for the engines' Generate streams (docs/DECISIONS.md D44).

Why not ``grpc.aio`` for these: every message it delivers is its own receive operation on gRPC's
completion queue, polled by a thread that wakes the event loop (about 34 µs of CPU per message here,
as much as the Rust gateway spends on a whole token). Here the loop reads the socket itself: one
``data_received`` carries many frames of many streams, each stream's messages are decoded as they
complete, and a consumer woken once takes every message that arrived (so the surface can answer
several tokens with one write). ``grpc.aio`` keeps everything else (unary control RPCs, TLS).

What the client does, and no more (RFC 9113, gRPC over HTTP/2):

- prior-knowledge HTTP/2 (the client preface, no upgrade), push disabled, TCP_NODELAY; the
  connection's receive window as large as HTTP/2 allows (re-opened every GiB consumed), each
  stream's --grpc-stream-window-bytes (1 MiB), given back only once the consumer took every message
  that arrived, so a consumer that stops reading (a slow client) stops its engine stream at one
  window; the peer's windows respected on send (a long prompt waits for WINDOW_UPDATE);
- HEADERS/CONTINUATION through one HPACK encoder and decoder per connection (every header block
  decoded, in order, so the dynamic table stays in step; a block seen before that changed nothing
  in the table, while it still has not changed, takes the fields it decoded to then); SETTINGS
  acknowledged, PING answered,
  GOAWAY honoured (streams past its last id fail as UNAVAILABLE, no new streams), RST_STREAM;
- gRPC's length-prefixed messages (uncompressed: no grpc-encoding is offered), status from the
  trailers (or a trailers-only answer); cancelling a call sends RST_STREAM CANCEL, which ends the
  call on the engine's server as a cancellation does.

A connection that breaks fails its calls as UNAVAILABLE (retried on another worker while nothing
reached the client) and is replaced by the next call, as is one idle for a minute (no keepalive
pings: a fresh connection costs one round trip). The worker's SETTINGS_MAX_CONCURRENT_STREAMS is
kept by opening another connection when one is full.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
import time
from typing import Any, Callable, Generic, TypeVar, cast
from urllib.parse import unquote

import hpack
from hpack.table import HeaderTable

__all__ = ["GrpcStatus", "GrpcStatusError", "H2Call", "H2Connection", "H2Channel"]

T = TypeVar("T")

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_MAX_WINDOW = 2**31 - 1
_REOPEN_AFTER = 2**30  # consumed bytes after which the connection's receive window is re-opened
_CANCEL = 0x8
_FRAME_HEAD = struct.Struct(">IBI")  # length (24 bits) and type in one word, flags, stream id
_SETTING = struct.Struct(">HI")
_DATA_HEAD = struct.Struct(">IBIBI")  # a frame's head and the gRPC message prefix after it, in one read
_DEFAULT_WINDOW = 65_535
_DEFAULT_FRAME = 16_384
_MAX_HEADER_BLOCK = 1 << 20  # a peer's header block past this fails the connection
IDLE_REPLACE_SECS = 60.0  # a connection idle this long is replaced rather than trusted
# gRPC's mapping of an HTTP status that is not 200 (a proxy's answer): these are retryable or final
# as the gRPC status they stand for; any other is UNKNOWN.
_HTTP_TO_GRPC = {"400": 13, "401": 16, "403": 7, "404": 12, "429": 14, "502": 14, "503": 14, "504": 14}


class GrpcStatus:
    """The gRPC status codes the client names."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    INTERNAL = 13
    UNAVAILABLE = 14

    NAMES = {
        0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
        6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
        10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
        15: "DATA_LOSS", 16: "UNAUTHENTICATED",
    }  # fmt: skip


class GrpcStatusError(Exception):
    """A call that ended with a status other than OK (or whose connection failed: UNAVAILABLE)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(f"{GrpcStatus.NAMES.get(code, code)}: {details}")
        self.code = code
        self.details = details

    @property
    def name(self) -> str:
        return GrpcStatus.NAMES.get(self.code, str(self.code))


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload) << 8 | kind).to_bytes(4, "big") + bytes((flags,)) + stream_id.to_bytes(4, "big") + payload


def _unquote(text: str) -> str:
    """grpc-message is percent-encoded."""
    return unquote(text) if "%" in text else text


class H2Call(Generic[T]):
    """One server-streaming call: its messages as they arrive (:meth:`take` for all that are ready,
    or ``async for``), then its status. :meth:`cancel` resets the stream."""

    __slots__ = (
        "_connection", "stream_id", "_decode", "_buffer", "_messages", "_waiter", "error", "done",
        "_pending", "send_window", "_headers_seen", "_block", "_block_end_stream", "_uncredited",
    )  # fmt: skip

    def __init__(self, connection: H2Connection, stream_id: int, decode: Callable[[bytes], T]) -> None:
        self._connection = connection
        self.stream_id = stream_id
        self._decode = decode
        self._buffer = bytearray()
        self._messages: collections.deque[T] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self.error: Exception | None = None
        self.done = False  # the peer ended the stream (status read) or the call failed
        self._pending = b""  # request bytes the peer's windows have not admitted yet
        self.send_window = connection.peer_initial_window
        self._headers_seen = False
        self._block = bytearray()
        self._block_end_stream = False
        self._uncredited = 0  # received bytes not yet given back to the peer's window for this stream

    # -- reading ---------------------------------------------------------------------------------

    @property
    def ready(self) -> int:
        """Messages that arrived and were not taken yet."""
        return len(self._messages)

    def drain(self) -> list[T]:
        """Every message that arrived and was not taken yet (none wait)."""
        if not self._messages:  # the usual case; __anext__ gave the window back when it emptied them
            return []
        messages = list(self._messages)
        self._messages.clear()
        self._credit()
        return messages

    def _credit(self) -> None:
        """Give the peer back the window of what was read, once the consumer has taken every message
        (a consumer that stops taking them stops the engine at one window: what a slow client can
        make the gateway hold per stream is bounded by --grpc-stream-window-bytes)."""
        if self._uncredited >= self._connection.credit_after and not self.done:
            self._connection.credit(self.stream_id, self._uncredited)
            self._uncredited = 0

    def __aiter__(self) -> H2Call[T]:
        return self

    async def __anext__(self) -> T:
        while not self._messages:
            if self.done:
                if self.error is not None:
                    raise self.error
                raise StopAsyncIteration
            # The wait, written out here (no coroutine of its own to create and resume per message).
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        message = self._messages.popleft()
        if not self._messages and self._uncredited >= self._connection.credit_after:
            self._credit()  # (its test written out: most messages leave nothing to give back)
        return message

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def cancel(self) -> None:
        """Stop the call: RST_STREAM CANCEL (the engine's server sees the call cancelled)."""
        if not self.done:
            self._finish(GrpcStatusError(GrpcStatus.CANCELLED, "cancelled by the client"))
            self._connection.reset(self.stream_id)

    # -- fed by the connection ----------------------------------------------------------------------

    def _finish(self, error: Exception | None) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        self._connection.forget(self.stream_id)
        self._wake()

    def _data(self, payload: bytes, end_stream: bool, flow: int) -> None:
        self._uncredited += flow
        buffer = self._buffer
        if (
            not buffer and len(payload) > 5 and not payload[0]
            and int.from_bytes(payload[1:5], "big") == len(payload) - 5
        ):  # fmt: skip
            # One whole uncompressed message in this frame and nothing held: the usual case while an
            # engine decodes, read without the buffer's copies (what the loop below does with it).
            try:
                self._messages.append(self._decode(payload[5:]))
            except Exception as exc:  # noqa: BLE001 - a message that does not parse ends the call
                self._finish(GrpcStatusError(GrpcStatus.INTERNAL, f"a message did not parse: {exc}"))
                self._connection.reset(self.stream_id)
                return
            if end_stream:
                self._finish(GrpcStatusError(GrpcStatus.INTERNAL, "the stream ended without a status"))
            else:
                self._wake()
            return
        buffer += payload
        start = 0
        size = len(buffer)
        found = False
        while size - start >= 5:
            length = int.from_bytes(buffer[start + 1 : start + 5], "big")
            if size - start - 5 < length:
                break
            if buffer[start]:
                self._finish(GrpcStatusError(GrpcStatus.INTERNAL, "a compressed message, which was not offered"))
                self._connection.reset(self.stream_id)
                return
            try:
                self._messages.append(self._decode(bytes(buffer[start + 5 : start + 5 + length])))
            except Exception as exc:  # noqa: BLE001 - a message that does not parse ends the call
                self._finish(GrpcStatusError(GrpcStatus.INTERNAL, f"a message did not parse: {exc}"))
                self._connection.reset(self.stream_id)
                return
            start += 5 + length
            found = True
        if start:
            del buffer[:start]
        if end_stream:
            self._finish(GrpcStatusError(GrpcStatus.INTERNAL, "the stream ended without a status"))
        elif found:
            self._wake()
        elif not self._messages:
            self._credit()  # a message larger than the window still arrives

    def _header_block(self, headers: list[tuple[str, str]], end_stream: bool) -> None:
        if not self._headers_seen:
            self._headers_seen = True
            fields = dict(headers)
            status = fields.get(":status")
            if status != "200":
                code = _HTTP_TO_GRPC.get(status or "", GrpcStatus.UNKNOWN) if status else GrpcStatus.INTERNAL
                self._finish(GrpcStatusError(code, f"HTTP status {status}"))
                if not end_stream:
                    self._connection.reset(self.stream_id)
                return
            if not end_stream:
                return  # the response's headers; messages and trailers follow
        self._trailers(dict(headers))

    def _trailers(self, fields: dict[str, str]) -> None:
        code_text = fields.get("grpc-status")
        if code_text is None:
            self._finish(GrpcStatusError(GrpcStatus.INTERNAL, "the stream ended without a grpc-status"))
            return
        code = int(code_text) if code_text.isdigit() else GrpcStatus.UNKNOWN
        if code == GrpcStatus.OK:
            self._finish(None)
        else:
            self._finish(GrpcStatusError(code, _unquote(fields.get("grpc-message", ""))))


_KEPT_BLOCKS = 64  # header blocks kept per connection (H2Connection._header_block)


class _CountedTable(HeaderTable):
    """hpack's dynamic table, counting its changes, additions and size settings (a header block that
    changed nothing can be sent again, or its decoded fields reused, while the count stays)."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, size: int) -> None:
        self.changes += 1
        HeaderTable.maxsize.fset(self, size)  # type: ignore[attr-defined]


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection to one worker (see the module's docstring)."""

    def __init__(self, authority: str, stream_window: int = 1 << 20) -> None:
        self.authority = authority
        self.stream_window = min(max(stream_window, _DEFAULT_WINDOW), _MAX_WINDOW)
        self.credit_after = self.stream_window // 4
        self.peer_max_streams = 2**31
        self.idle_since = time.monotonic()
        self.transport: asyncio.Transport | None = None
        self._encoder = hpack.Encoder()
        self._table = self._encoder.header_table = _CountedTable()
        # Header blocks that changed nothing in the encoder's table, by (path, metadata): sent again as
        # they are while the table stays as it was (what the peer's decoder holds is then the same).
        self._blocks: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, bytes]] = {}
        self._decoder = hpack.Decoder()
        self._decoder.max_allowed_table_size = 1 << 16
        self._decoding = self._decoder.header_table = _CountedTable()
        # Received header blocks that changed nothing in the decoder's table, by their bytes: their
        # fields, the same while the table stays as it was (a worker's response headers and trailers).
        self._decoded: dict[bytes, tuple[int, list[tuple[str, str]]]] = {}
        self._calls: dict[int, H2Call[Any]] = {}
        self._next_id = 1
        self._buffer = bytearray()
        self.send_window = _DEFAULT_WINDOW
        self.peer_initial_window = _DEFAULT_WINDOW
        self._peer_frame = _DEFAULT_FRAME
        self._consumed = 0
        self._blocked: collections.OrderedDict[int, None] = collections.OrderedDict()  # calls waiting to send
        self._continuing: int | None = None  # the stream whose header block CONTINUATION frames extend
        self._orphan_block = bytearray()  # a header block of a stream no call waits for (still decoded)
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # peer SETTINGS seen
        self.failed: Exception | None = None
        self.going_away = False

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        settings = _SETTING.pack(2, 0) + _SETTING.pack(4, self.stream_window)  # ENABLE_PUSH 0, INITIAL_WINDOW_SIZE
        self.transport.write(
            _PREFACE + _frame(_SETTINGS, 0, 0, settings)
            + _frame(_WINDOW_UPDATE, 0, 0, (_MAX_WINDOW - _DEFAULT_WINDOW).to_bytes(4, "big"))
        )  # fmt: skip

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"the connection was lost ({exc})" if exc else "the connection was closed")

    def data_received(self, data: bytes) -> None:
        buffer = bytes(self._buffer) + data if self._buffer else data
        start = 0
        size = len(buffer)
        while size - start >= 9:
            if size - start >= 14:  # with what would be a DATA frame's message prefix (one read, D115)
                head, flags, stream_id, compressed, message_length = _DATA_HEAD.unpack_from(buffer, start)
            else:  # a short frame (or a part of one): no DATA frame of a message is whole here
                head, flags, stream_id = _FRAME_HEAD.unpack_from(buffer, start)
                compressed = message_length = 0
            length = head >> 8
            if length > _DEFAULT_FRAME:  # past the SETTINGS_MAX_FRAME_SIZE we keep (the default)
                self._protocol_error(f"a frame of {length} bytes")
                return
            body = start + 9
            end = body + length
            if end > size:
                break
            start = end
            if not flags and head & 0xFF == _DATA and self._continuing is None and length > 5:
                # A DATA frame without flags: one per engine message while it decodes. Read here (no
                # _frame or _data call, no payload copied before the message's own bytes) when it
                # holds one whole uncompressed message and its call holds nothing partial; what
                # _frame and H2Call._data do with it, written out.
                consumed = self._consumed + length
                if consumed >= _REOPEN_AFTER and self.transport is not None:
                    self.transport.write(_frame(_WINDOW_UPDATE, 0, 0, consumed.to_bytes(4, "big")))
                    consumed = 0
                self._consumed = consumed
                call = self._calls.get(stream_id & 0x7FFFFFFF)
                if call is None:
                    continue
                if compressed or message_length != length - 5 or call._buffer:
                    call._data(buffer[body:end], False, length)
                else:
                    call._uncredited += length
                    try:
                        call._messages.append(call._decode(buffer[body + 5 : end]))
                    except Exception as exc:  # noqa: BLE001 - a message that does not parse ends the call
                        call._finish(GrpcStatusError(GrpcStatus.INTERNAL, f"a message did not parse: {exc}"))
                        self.reset(call.stream_id)
                        continue
                    waiter = call._waiter
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                if self.failed is not None:
                    return
                continue
            self._frame(head & 0xFF, flags, stream_id & 0x7FFFFFFF, buffer[body:end])
            if self.failed is not None:
                return
        if start < size:
            self._buffer = bytearray(buffer[start:])
        elif self._buffer:
            self._buffer = bytearray()

    # -- frames ----------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is not None and kind != _CONTINUATION:
            self._protocol_error("a header block was interrupted")
            return
        if kind == _DATA:
            flow = len(payload)
            consumed = self._consumed + flow  # _consume written out: a DATA frame per engine message
            if consumed >= _REOPEN_AFTER and self.transport is not None:
                self.transport.write(_frame(_WINDOW_UPDATE, 0, 0, consumed.to_bytes(4, "big")))
                consumed = 0
            self._consumed = consumed
            call = self._calls.get(stream_id)
            if call is None:
                return
            if flags & _PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            call._data(payload, bool(flags & _END_STREAM), flow)
        elif kind == _HEADERS:
            if flags & _PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & _PRIORITY:
                payload = payload[5:]
            self._start_block(stream_id, payload, flags)
        elif kind == _CONTINUATION:
            if self._continuing != stream_id:
                self._protocol_error("an unexpected CONTINUATION frame")
                return
            self._extend_block(stream_id, payload, flags)
        elif kind == _WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
            else:
                call = self._calls.get(stream_id)
                if call is None:
                    return
                call.send_window += increment
            self._flush_blocked()
        elif kind == _SETTINGS:
            if not flags & _ACK:
                self._settings(payload)
        elif kind == _PING:
            if not flags & _ACK and self.transport is not None:
                self.transport.write(_frame(_PING, _ACK, 0, bytes(payload)))
        elif kind == _RST_STREAM:
            call = self._calls.get(stream_id)
            if call is not None:
                code = int.from_bytes(payload[:4], "big")
                status = GrpcStatus.UNAVAILABLE if code == 0x7 else GrpcStatus.INTERNAL  # REFUSED_STREAM: retryable
                call._finish(GrpcStatusError(status, f"the stream was reset (HTTP/2 error {code})"))
        elif kind == _GOAWAY:
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self.going_away = True
            for stream, call in list(self._calls.items()):
                if stream > last:
                    call._finish(GrpcStatusError(GrpcStatus.UNAVAILABLE, "the worker is going away"))
        # PRIORITY, PUSH_PROMISE (push is off) and unknown frame types are ignored

    def _settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - len(payload) % 6, 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == 1:
                self._encoder.header_table_size = value
            elif key == 4:
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self._calls.values():
                    call.send_window += delta
            elif key == 5:
                self._peer_frame = value
            elif key == 3:
                self.peer_max_streams = value
        if self.transport is not None:
            self.transport.write(_frame(_SETTINGS, _ACK, 0))
        if not self.settled.done():
            self.settled.set_result(None)
        self._flush_blocked()

    def _start_block(self, stream_id: int, payload: bytes, flags: int) -> None:
        call = self._calls.get(stream_id)
        block = call._block if call is not None else bytearray()
        block[:] = payload
        if call is not None:
            call._block_end_stream = bool(flags & _END_STREAM)
        if flags & _END_HEADERS:
            self._end_block(stream_id, block, bool(flags & _END_STREAM))
        else:
            self._continuing = stream_id
            if call is None:
                self._orphan_block = block

    def _extend_block(self, stream_id: int, payload: bytes, flags: int) -> None:
        call = self._calls.get(stream_id)
        block = call._block if call is not None else self._orphan_block
        block += payload
        if len(block) > _MAX_HEADER_BLOCK:
            self._protocol_error("a header block is too large")
            return
        if flags & _END_HEADERS:
            self._continuing = None
            self._end_block(stream_id, block, call._block_end_stream if call is not None else False)

    def _end_block(self, stream_id: int, block: bytearray, end_stream: bool) -> None:
        data = bytes(block)
        table = self._decoding
        kept = self._decoded.get(data)
        if kept is not None and kept[0] == table.changes:
            fields = kept[1]  # decoding it again would give the same fields and leave the table as it is
        else:
            changes = table.changes
            try:
                headers = self._decoder.decode(data)  # always, to keep the dynamic table in step
            except hpack.HPACKError as exc:
                self._protocol_error(f"a header block did not decode ({exc})")
                return
            fields = [(str(name), str(value)) for name, value in headers]
            if table.changes == changes:
                if len(self._decoded) >= _KEPT_BLOCKS:
                    self._decoded.clear()
                self._decoded[data] = (changes, fields)
        block.clear()
        call = self._calls.get(stream_id)
        if call is not None:
            call._header_block(fields, end_stream)

    def _consume(self, size: int) -> None:
        self._consumed += size
        if self._consumed >= _REOPEN_AFTER and self.transport is not None:
            self.transport.write(_frame(_WINDOW_UPDATE, 0, 0, self._consumed.to_bytes(4, "big")))
            self._consumed = 0

    def _protocol_error(self, reason: str) -> None:
        if self.transport is not None:
            # last stream id 0 (a client processes no streams the server opened), PROTOCOL_ERROR
            self.transport.write(_frame(_GOAWAY, 0, 0, (0).to_bytes(4, "big") + (1).to_bytes(4, "big")))
            self.transport.close()
        self._fail(f"HTTP/2 protocol error: {reason}")

    def _fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = GrpcStatusError(GrpcStatus.UNAVAILABLE, reason)
        if not self.settled.done():
            self.settled.set_exception(self.failed)
            self.settled.exception()  # retrieved: a connection that never settled needs no warning
        for call in list(self._calls.values()):
            call._finish(self.failed)

    # -- calls -----------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Open, not going away, with stream ids left, and not idle so long that a middlebox may
        have dropped it unseen (then a new connection is cheaper than a call that never returns)."""
        if self.failed is not None or self.going_away or self._next_id >= 2**31 - 2:
            return False
        return bool(self._calls) or time.monotonic() - self.idle_since < IDLE_REPLACE_SECS

    @property
    def has_room(self) -> bool:
        return len(self._calls) < self.peer_max_streams

    def credit(self, stream_id: int, size: int) -> None:
        if self.transport is not None and self.failed is None:
            self.transport.write(_frame(_WINDOW_UPDATE, 0, stream_id, size.to_bytes(4, "big")))

    def _header_block(self, path: str, metadata: tuple[tuple[str, str], ...]) -> bytes:
        """A request's HPACK header block. Once the table holds every field of a (path, metadata), its
        block is only references into the table: that block is kept and sent again, byte for byte what
        the encoder would write, until the table changes (an addition or a size change) — encoding it
        again cost about a tenth of a short request's CPU."""
        table = self._table
        key = (path, metadata)
        kept = self._blocks.get(key)
        if kept is not None and kept[0] == table.changes and not table.resized:
            return kept[1]
        changes, resized = table.changes, table.resized
        block = self._encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority),
            ("te", "trailers"), ("content-type", "application/grpc"), ("user-agent", "gw-grpc-h2"), *metadata,
        ])  # fmt: skip
        if table.changes == changes and not resized:
            if len(self._blocks) >= _KEPT_BLOCKS:
                self._blocks.clear()
            self._blocks[key] = (changes, block)
        return block

    def start(
        self, path: str, message: bytes, metadata: tuple[tuple[str, str], ...], decode: Callable[[bytes], T]
    ) -> H2Call[T]:
        """Open a stream: the request's headers and its one message, as far as the windows allow."""
        assert self.transport is not None
        stream_id = self._next_id
        self._next_id += 2
        call: H2Call[T] = H2Call(self, stream_id, decode)
        self._calls[stream_id] = call
        block = self._header_block(path, metadata)
        frames = bytearray()
        limit = self._peer_frame
        first, rest = block[:limit], block[limit:]
        frames += _frame(_HEADERS, 0 if rest else _END_HEADERS, stream_id, first)
        while rest:
            piece, rest = rest[:limit], rest[limit:]
            frames += _frame(_CONTINUATION, 0 if rest else _END_HEADERS, stream_id, piece)
        call._pending = b"\x00" + len(message).to_bytes(4, "big") + message
        self._send_pending(call, bytes(frames))  # one write: a send per request, not one per frame kind
        return call

    def _send_pending(self, call: H2Call[Any], before: bytes = b"") -> None:
        """Send what the windows admit of ``call``'s pending bytes, after ``before`` (frames of the
        same stream to go first, in the same write)."""
        assert self.transport is not None
        pending = call._pending
        frames = [before] if before else []
        while pending:
            size = min(len(pending), self.send_window, call.send_window, self._peer_frame)
            if size <= 0:
                break
            piece, pending = pending[:size], pending[size:]
            self.send_window -= size
            call.send_window -= size
            frames.append(_frame(_DATA, 0 if pending else _END_STREAM, call.stream_id, piece))
        call._pending = pending
        if frames:
            self.transport.write(b"".join(frames))
        if pending:
            self._blocked[call.stream_id] = None
        else:
            self._blocked.pop(call.stream_id, None)

    def _flush_blocked(self) -> None:
        for stream_id in list(self._blocked):
            call = self._calls.get(stream_id)
            if call is None:
                self._blocked.pop(stream_id, None)
                continue
            self._send_pending(call)
            if self.send_window <= 0:
                return

    def reset(self, stream_id: int) -> None:
        self.forget(stream_id)
        if self.transport is not None and self.failed is None:
            self.transport.write(_frame(_RST_STREAM, 0, stream_id, _CANCEL.to_bytes(4, "big")))

    def forget(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        self._blocked.pop(stream_id, None)
        if not self._calls:
            self.idle_since = time.monotonic()
        if self.going_away and not self._calls and self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class H2Channel:
    """The worker's connections: one, opened on first use, and more only while the worker's
    SETTINGS_MAX_CONCURRENT_STREAMS fills one; a connection that failed, goes away or sat idle too
    long is replaced."""

    def __init__(
        self, host: str, port: int, authority: str, *, stream_window: int = 1 << 20, connect_timeout: float = 10.0
    ) -> None:
        self.host = host
        self.port = port
        self.authority = authority
        self.stream_window = stream_window
        self.connect_timeout = connect_timeout
        self._connections: list[H2Connection] = []
        self._connecting: asyncio.Future[H2Connection] | None = None

    async def connection(self) -> H2Connection:
        live = []
        found: H2Connection | None = None
        for connection in self._connections:
            if connection.usable:
                live.append(connection)
                if found is None and connection.has_room:
                    found = connection
            elif not connection._calls:
                connection.close()
            else:
                live.append(connection)  # still serving its calls; no new ones
        self._connections = live
        if found is not None:
            return found
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> H2Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, protocol = await loop.create_connection(
                    lambda: H2Connection(self.authority, self.stream_window), self.host, self.port
                )
                await protocol.settled
        except (OSError, TimeoutError) as exc:
            raise GrpcStatusError(GrpcStatus.UNAVAILABLE, f"cannot connect to {self.authority}: {exc}") from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connections.append(protocol)
        return protocol

    async def unary_stream(
        self, path: str, message: bytes, metadata: tuple[tuple[str, str], ...], decode: Callable[[bytes], T]
    ) -> H2Call[T]:
        connection = await self.connection()
        return connection.start(path, message, metadata, decode)

    def close(self) -> None:
        for connection in self._connections:
            connection.close()
        self._connections = []

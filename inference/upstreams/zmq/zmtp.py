"""The data-plane sockets of a ZMQ worker as ZMTP 3 endpoints on the event loop itself: the output
PULL (:class:`PullServer`) and the input ROUTER (:class:`RouterServer`). The engines' PUSH and DEALER
sockets (libzmq) dial in to Unix socket servers of the loop; their messages are parsed from the
bytes each read brings and the gateway's are written to the connection, without libzmq.

Why (D95): a libzmq socket hands each message between its I/O thread and the caller's thread
through a mailbox and an eventfd; one engine message arriving alone cost the gateway about eight
system calls (the I/O thread's ``epoll_wait``, ``recvfrom``, ``getpid`` and ``write``; then the
loop's ``epoll_wait`` and libzmq's ``getpid`` + ``poll`` / ``getpid`` + ``read`` checks up to
EAGAIN), and the engine core sends a message per step; a request sent cost about as many (each
``zmq_send`` checks the mailbox, the I/O thread is woken to write it). Here a message read is part
of one ``epoll_wait`` and one ``recv_into`` of the loop, however many the read carries, and a
message sent is one write.

The wire (ZMTP 3.0, rfc.zeromq.org/spec/23, NULL mechanism, rfc.zeromq.org/spec/37 for PING):

- greeting, 64 bytes each way: ``0xFF``, 8 padding bytes, ``0x7F``, version 3.0, mechanism
  ``NULL`` padded to 20 bytes, as-server 0, 31 zero bytes;
- then each side's ``READY`` command, its metadata the ``Socket-Type`` (``PULL``, whose peers must
  be ``PUSH``; ``ROUTER``, whose peers must be ``DEALER``) and a DEALER's ``Identity``;
- then frames: a flags byte (``0x01`` more frames follow, ``0x02`` long size, ``0x04`` command),
  the size (1 byte, or 8 bytes big-endian when long), the body. A message is its frames up to the
  one without ``more``. Commands after the handshake: ``PING`` is answered with ``PONG`` (its
  context echoed), ``ERROR`` ends the connection, others are ignored.

What the libzmq sockets did and this keeps: a bound ``ipc://`` path replaces a stale socket file
(libzmq unlinks one too); an engine's output connection dropping is reported (the socket monitor's
DISCONNECTED before); several engines (``dp_size``) may connect, their messages handled in arrival
order per connection; the ROUTER receives each message after its peer's identity, sends to the
connection of an identity and refuses an unknown one (``ROUTER_MANDATORY``), and a new connection
with a known identity takes it over (``ROUTER_HANDOVER``). Writes have no high-water mark: a
request is a few kilobytes, written at once or held by the transport until the socket takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Callable
from typing import cast

__all__ = ["GREETING", "MAX_MESSAGE_BYTES", "PullServer", "RouterServer", "command", "encode_message"]

logger = logging.getLogger(__name__)

_GREETING_SIZE = 64
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
_BUFFER = 256 * 1024  # one read's room (a frame larger than it gets a buffer of its own size)
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""The most one message (its frames' bodies together) may hold: a peer declaring a larger frame, or
sending more frames than that in one message, is dropped as an engine whose connection broke (libzmq's
own default is no limit; a frame's declared size would otherwise be allocated as it is announced)."""
_BACKLOG = 100  # asyncio's default
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04


def command(name: bytes, body: bytes = b"") -> bytes:
    """A command frame: ``name`` (its length first), then ``body``."""
    payload = bytes((len(name),)) + name + body
    if len(payload) > 255:
        return bytes((_COMMAND | _LONG,)) + len(payload).to_bytes(8, "big") + payload
    return bytes((_COMMAND, len(payload))) + payload


def _properties(pairs: dict[bytes, bytes]) -> bytes:
    return b"".join(bytes((len(k),)) + k + len(v).to_bytes(4, "big") + v for k, v in pairs.items())


def _parse_properties(body: bytes) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(body):
        size = body[pos]
        name = body[pos + 1 : pos + 1 + size]
        pos += 1 + size
        length = int.from_bytes(body[pos : pos + 4], "big")
        found[name.lower()] = body[pos + 4 : pos + 4 + length]
        pos += 4 + length
    return found


MessageSink = Callable[[list[bytes]], None]


def encode_message(frames: tuple[bytes, ...] | list[bytes]) -> list[bytes]:
    """A message's frames as written: each frame's flags and size, then its body."""
    parts: list[bytes] = []
    last = len(frames) - 1
    for number, frame in enumerate(frames):
        more = _MORE if number < last else 0
        size = len(frame)
        parts.append(bytes((more | _LONG,)) + size.to_bytes(8, "big") if size > 255 else bytes((more, size)))
        parts.append(frame)
    return parts


class _Connection(asyncio.BufferedProtocol):
    """One engine's connection: the greeting, the NULL handshake, then its messages."""

    def __init__(self, server: _Endpoint) -> None:
        self.server = server
        self.identity = b""  # a DEALER's routing id (its READY's Identity)
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray(_BUFFER)
        self.view = memoryview(self.buffer)
        self.end = 0  # bytes held in the buffer
        self.greeted = False  # the peer's greeting was read
        self.ready = False  # the peer's READY was read: messages may follow
        self.frames: list[bytes] = []  # the message being read (its frames so far)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.server.connections.add(self)
        self.transport.write(GREETING + self.server.ready)  # the peer reads the greeting by its exact size first

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        end = self.end + nbytes
        pos = 0
        if not self.ready:
            pos = self._handshake(end)
            if pos < 0:
                return
        buffer, view, frames, deliver = self.buffer, self.view, self.frames, self.server.deliver
        while end - pos >= 2:
            flags = buffer[pos]
            if flags & _LONG:
                if end - pos < 9:
                    break
                start = pos + 9
                stop = int.from_bytes(view[pos + 1 : start], "big")
                if stop > MAX_MESSAGE_BYTES:
                    self._drop(f"a frame of {stop} bytes, more than a message may hold ({MAX_MESSAGE_BYTES})")
                    return
                stop += start
            else:
                start = pos + 2
                stop = start + buffer[pos + 1]
            if stop > end:
                break
            body = bytes(view[start:stop])
            pos = stop
            if flags & _COMMAND:
                if not self._command(body):
                    return
            elif flags & _MORE:
                frames.append(body)
                if sum(map(len, frames)) > MAX_MESSAGE_BYTES:
                    self._drop(f"a message of more than {MAX_MESSAGE_BYTES} bytes")
                    return
            else:
                frames.append(body)
                self.frames = []
                if len(frames) > 1 and sum(map(len, frames)) > MAX_MESSAGE_BYTES:
                    self._drop(f"a message of more than {MAX_MESSAGE_BYTES} bytes")
                    return
                try:
                    deliver(self, frames)
                except Exception:  # a bug in handling one message must not stop the reading
                    logger.exception("ZMQ output %s: handling a message failed", self.server.path)
                frames = self.frames
        self._keep(pos, end)

    def _keep(self, pos: int, end: int) -> None:
        """Move the bytes not parsed yet (a frame's beginning) to the buffer's start, or into a
        buffer of its own size when the frame is larger (never resized in place: the transport
        holds a view of it while it reads)."""
        rest = end - pos
        needed = self._frame_size(pos, end)
        if needed > MAX_MESSAGE_BYTES + 9:
            self._drop(f"a frame of {needed - 9} bytes, more than a message may hold ({MAX_MESSAGE_BYTES})")
            self.end = 0
            return
        if needed > len(self.buffer):
            bigger = bytearray(needed)
            bigger[:rest] = self.view[pos:end]
            self.buffer, self.view = bigger, memoryview(bigger)
        elif pos:
            self.buffer[:rest] = self.buffer[pos:end]
        self.end = rest

    def _frame_size(self, pos: int, end: int) -> int:
        """The whole size (header and body) of the frame starting at ``pos``; 9 (the longest
        header) while its header is not all there."""
        if end - pos < 2 or (self.buffer[pos] & _LONG and end - pos < 9):
            return 9
        if self.buffer[pos] & _LONG:
            return 9 + int.from_bytes(self.view[pos + 1 : pos + 9], "big")
        return 2 + self.buffer[pos + 1]

    def _handshake(self, end: int) -> int:
        """The greeting and the peer's READY: where the messages start in the buffer, or -1 while
        they are not all there (or the connection was refused)."""
        pos = 0
        if not self.greeted:
            if end < _GREETING_SIZE:
                self.end = end
                return -1
            greeting = bytes(self.view[:_GREETING_SIZE])
            mechanism = greeting[12:32].rstrip(b"\x00")
            if greeting[0] != 0xFF or not greeting[9] & 1 or greeting[10] < 3 or mechanism != b"NULL":
                self._refuse(f"a peer that is not a ZMTP 3 NULL socket ({greeting[:12].hex()}, {mechanism!r})")
                return -1
            self.greeted = True
            pos = _GREETING_SIZE
        size = self._frame_size(pos, end)
        if pos + size > end:
            self._keep(pos, end)
            return -1
        header = 9 if self.buffer[pos] & _LONG else 2
        body = bytes(self.view[pos + header : pos + size])
        if not self.buffer[pos] & _COMMAND or not body or body[1 : 1 + body[0]] != b"READY":
            self._refuse("a peer that did not start with READY")
            return -1
        properties = _parse_properties(body[1 + body[0] :])
        socket_type = properties.get(b"socket-type")
        if socket_type != self.server.peer_type:
            self._refuse(f"a {socket_type!r} peer (this socket takes {self.server.peer_type!r} peers)")
            return -1
        self.identity = properties.get(b"identity") or b""
        self.ready = True
        self.server.joined(self)
        return pos + size

    def _command(self, body: bytes) -> bool:
        """A command after the handshake; False when it ended the connection."""
        name = body[1 : 1 + body[0]] if body else b""
        if name == b"PING" and self.transport is not None:  # TTL (2 bytes), then the context to echo
            self.transport.write(command(b"PONG", body[1 + body[0] + 2 :]))
        elif name == b"ERROR":
            self._refuse(f"the peer's error: {body[2 + body[0] :].decode('utf-8', 'replace')}")
            return False
        return True

    def _drop(self, why: str) -> None:
        """Close a connection that broke the limits: an engine's that had joined is reported lost
        (its requests in flight end), as when it drops."""
        logger.warning("ZMQ %s: connection closed: %s", self.server.path, why)
        self.frames = []
        if self.transport is not None:
            self.transport.close()

    def _refuse(self, why: str) -> None:
        logger.warning("ZMQ output %s: connection closed: %s", self.server.path, why)
        self.ready = False  # not an engine lost: it never was one
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.ready:
            self.server.left(self)


class _Endpoint:
    """A bound ZMTP endpoint (``ipc://PATH``) of one socket type, and its peers' connections."""

    socket_type = b""
    peer_type = b""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ready = command(b"READY", _properties({b"Socket-Type": self.socket_type}))
        self.connections: set[_Connection] = set()
        self.closing = False
        self._server: asyncio.Server | None = None
        self._serving: asyncio.Future[asyncio.Server] | None = None
        self._listener: socket.socket | None = None

    def start(self) -> None:
        """Bind and listen at once (a stale socket file at the path is replaced, as libzmq does;
        OSError when the path cannot be bound); serving starts on the loop's next turns, peers
        dialing in meanwhile wait in the listen backlog."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.stat(self.path).st_mode):
                    os.unlink(self.path)
            listener.bind(self.path)
            listener.listen(_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        loop = asyncio.get_running_loop()
        serving = asyncio.ensure_future(loop.create_unix_server(lambda: _Connection(self), sock=listener))
        serving.add_done_callback(self._served)
        self._serving = serving

    def _served(self, serving: asyncio.Future[asyncio.Server]) -> None:
        if serving.cancelled() or self.closing:  # closed meanwhile: close() closed what there was
            return
        if serving.exception() is not None:
            logger.error("ZMQ output %s: cannot serve: %s", self.path, serving.exception())
            return
        self._server = serving.result()

    def close(self) -> None:
        """Stop listening, drop every connection (not reported as lost) and remove the socket file."""
        if self.closing:
            return
        self.closing = True
        serving = self._serving
        if serving is not None and serving.done() and not serving.cancelled() and serving.exception() is None:
            serving.result().close()  # closes the listening socket
        else:
            if serving is not None:
                serving.cancel()
            if self._listener is not None:
                self._listener.close()
        self._server = self._serving = self._listener = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        self.connections.clear()

    def joined(self, connection: _Connection) -> None:
        """A peer finished its handshake."""

    def deliver(self, connection: _Connection, frames: list[bytes]) -> None:
        raise NotImplementedError

    def left(self, connection: _Connection) -> None:
        """A peer that finished its handshake is gone."""


class PullServer(_Endpoint):
    """A bound ZMTP PULL endpoint: every message of every connected PUSH peer goes to ``sink`` (its
    frames, as bytes); ``lost`` is called when a peer's connection that finished its handshake drops
    (not when this endpoint closes)."""

    socket_type = b"PULL"
    peer_type = b"PUSH"

    def __init__(self, path: str, sink: MessageSink, lost: Callable[[], None]) -> None:
        super().__init__(path)
        self.sink = sink
        self.lost = lost

    def deliver(self, connection: _Connection, frames: list[bytes]) -> None:
        self.sink(frames)

    def left(self, connection: _Connection) -> None:
        if not self.closing:
            self.lost()


class RouterServer(_Endpoint):
    """A bound ZMTP ROUTER endpoint for DEALER peers: each message received goes to ``sink`` after
    its peer's identity (as a libzmq ROUTER's receive); :meth:`send` writes a message to the peer of
    an identity."""

    socket_type = b"ROUTER"
    peer_type = b"DEALER"

    def __init__(self, path: str, sink: MessageSink) -> None:
        super().__init__(path)
        self.sink = sink
        self.routes: dict[bytes, _Connection] = {}

    def joined(self, connection: _Connection) -> None:
        if not connection.identity:  # libzmq gives a peer without one a generated identity
            connection.identity = b"\x00" + os.urandom(4)
        old = self.routes.get(connection.identity)
        self.routes[connection.identity] = connection  # handover: the newest connection takes it
        if old is not None and old is not connection and old.transport is not None:
            old.ready = False
            old.transport.close()

    def deliver(self, connection: _Connection, frames: list[bytes]) -> None:
        self.sink([connection.identity, *frames])

    def left(self, connection: _Connection) -> None:
        if self.routes.get(connection.identity) is connection:
            del self.routes[connection.identity]

    def send(self, identity: bytes, frames: tuple[bytes, ...] | list[bytes]) -> bool:
        """Write the message to the peer of ``identity``; False when no such peer is connected."""
        connection = self.routes.get(identity)
        if connection is None or connection.transport is None or connection.transport.is_closing():
            return False
        connection.transport.writelines(encode_message(frames))
        return True

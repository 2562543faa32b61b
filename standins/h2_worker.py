"""A worker that speaks HTTP/2 with prior knowledge (h2c) as well as HTTP/1.1 on one port, as an h2c
server (hypercorn, a Rust engine's server) does: a stand-in for the gateway's HTTP/2 relay tests.

It is a front on a mock worker (:mod:`standins.mock_worker`, running on a loopback port of its own):
a connection that opens with the HTTP/2 preface is served by the ``h2`` package (a real HTTP/2 server
state machine: flow control, SETTINGS, RST_STREAM), each of its streams turned into an HTTP/1.1
request to the mock worker and its answer relayed back as it arrives, in DATA frames the gateway's
windows admit; any other connection is passed to the mock worker as it is (registration's probes
and health checks speak HTTP/1.1). A stream the client resets (RST_STREAM) closes its HTTP/1.1
request, so the mock worker counts it as a disconnected stream. :attr:`H2Front.h2_streams` counts
the streams served, :attr:`H2Front.resets` those the client reset.

``drop_after``: close an HTTP/2 connection abruptly after this many DATA frames of one stream (a
worker that dies mid-answer).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions

__all__ = ["H2Front"]

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class H2Front:
    """The front: :meth:`start` listens on 127.0.0.1 (``port``), relaying to ``inner_port``."""

    def __init__(self, inner_port: int, drop_after: int | None = None) -> None:
        self.inner_port = inner_port
        self.drop_after = drop_after
        self.h2_streams = 0
        self.resets = 0
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            first = await reader.read(len(_PREFACE))
            while first and len(first) < len(_PREFACE) and _PREFACE.startswith(first):
                more = await reader.read(len(_PREFACE) - len(first))
                if not more:
                    break
                first += more
            if first == _PREFACE:
                await _H2Connection(self, reader, writer).serve(first)
            elif first:
                await self._splice(first, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # (a cancelled connection task ends quietly: asyncio's stream callback reads its result)
        finally:
            writer.close()

    async def _splice(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """An HTTP/1.1 connection: bytes both ways to the mock worker."""
        inner_reader, inner_writer = await asyncio.open_connection("127.0.0.1", self.inner_port)
        inner_writer.write(first)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, inner_writer), pipe(inner_reader, writer))


class _H2Connection:
    def __init__(self, front: H2Front, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.front = front
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.requests: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        self.streams: dict[int, asyncio.Task[None]] = {}
        self.window_open = asyncio.Event()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def serve(self, first: bytes) -> None:
        self.conn.initiate_connection()
        self.flush()
        data = first
        try:
            while data:
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    self.flush()
                    return
                for event in events:
                    self.on(event)
                self.flush()
                await self.writer.drain()
                data = await self.reader.read(65536)
        finally:
            for task in list(self.streams.values()):
                task.cancel()

    def on(self, event: h2.events.Event) -> None:
        stream_id = int(getattr(event, "stream_id", None) or 0)
        if isinstance(event, h2.events.RequestReceived):
            self.requests[stream_id] = ([(str(k), str(v)) for k, v in event.headers or ()], bytearray())
            if event.stream_ended is not None:
                self.begin(stream_id)
        elif isinstance(event, h2.events.DataReceived):
            held = self.requests.get(stream_id)
            if held is not None:
                held[1].extend(event.data or b"")
            self.conn.acknowledge_received_data(event.flow_controlled_length or 0, stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            if stream_id in self.requests and stream_id not in self.streams:
                self.begin(stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self.front.resets += 1
            task = self.streams.pop(stream_id, None)
            if task is not None:
                task.cancel()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.window_open.set()

    def begin(self, stream_id: int) -> None:
        self.front.h2_streams += 1
        self.streams[stream_id] = self.front._spawn(self.relay(stream_id))

    async def relay(self, stream_id: int) -> None:
        headers, body = self.requests.pop(stream_id)
        fields = dict(headers)
        lines = [f"{fields.get(':method', 'GET')} {fields.get(':path', '/')} HTTP/1.1", f"Host: {fields.get(':authority', '')}"]
        lines += [f"{name}: {value}" for name, value in headers if not name.startswith(":") and name != "content-length"]
        lines += [f"Content-Length: {len(body)}", "Connection: close"]
        inner_reader, inner_writer = await asyncio.open_connection("127.0.0.1", self.front.inner_port)
        try:
            inner_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + bytes(body))
            status_line = await inner_reader.readline()
            status = status_line.split()[1].decode()
            answer: list[tuple[str, str]] = [(":status", status)]
            chunked = False
            while (line := await inner_reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                name, value = name.strip().lower(), value.strip()
                if name == "transfer-encoding":
                    chunked = "chunked" in value
                    continue
                if name in ("connection", "keep-alive"):
                    continue
                answer.append((name, value))
            # The head goes out with the first data, and a body of a known length ends with its last
            # data (one write per answer where it fits, as an HTTP/1.1 server writes one).
            self.conn.send_headers(stream_id, answer)
            length = next((int(value) for name, value in answer if name == "content-length"), None)
            frames = 0
            while True:
                if chunked:
                    size_line = await inner_reader.readline()
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        break
                    data = await inner_reader.readexactly(size)
                    await inner_reader.readexactly(2)
                else:
                    data = await inner_reader.read(65536 if length is None else min(65536, length))
                    if not data:
                        break
                    if length is not None:
                        length -= len(data)
                await self.send(stream_id, data, end=length == 0)
                if length == 0:
                    return
                frames += 1
                if self.front.drop_after is not None and frames >= self.front.drop_after:
                    self.writer.transport.abort()
                    return
            self.conn.end_stream(stream_id)
            self.flush()
        except (ConnectionError, asyncio.IncompleteReadError, h2.exceptions.StreamClosedError):
            pass
        finally:
            inner_writer.close()
            self.streams.pop(stream_id, None)

    async def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """``data`` as the peer's windows admit it (waiting for its WINDOW_UPDATE); ``end``: the
        stream ends with its last frame."""
        while data:
            room = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if room <= 0:
                self.window_open.clear()
                await self.window_open.wait()
                continue
            piece, data = data[:room], data[room:]
            self.conn.send_data(stream_id, piece, end_stream=end and not data)
            self.flush()
            await self.writer.drain()

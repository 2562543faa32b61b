"""A TCP fault proxy of our own, to cut the real services the gateway depends on (Postgres, Redis,
the broker) under traffic rather than mocking their clients.

:class:`FaultProxy` listens on 127.0.0.1 (a port of its own) and forwards every connection to the
real service. :meth:`FaultProxy.cut` resets every connection it carries and stops listening, so new
connections are refused, as when the service's host goes away; :meth:`FaultProxy.stall` keeps every
connection open but carries nothing more and accepts new ones that never get an answer, as a
partitioned network or a hung service does; :meth:`FaultProxy.restore` undoes either (stalled
connections are reset), so clients that reconnect reach the service again.
"""

from __future__ import annotations

import socket
import struct
import threading
__all__ = ["FaultProxy"]

_CHUNK = 65536
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, as a dead peer's host would


class FaultProxy:
    """A TCP forwarder from 127.0.0.1:``port`` to ``target`` that can drop everything on demand."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0  # accepted since start (a client did come through the proxy)
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._cut = False
        self._flowing = threading.Event()
        self._flowing.set()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def url(self, scheme: str, path: str = "", userinfo: str = "") -> str:
        """The service's URL through the proxy, e.g. url("redis", "/3")."""
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{at}127.0.0.1:{self.port}{path}"

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        with self._lock:
            self._cut = True
            listener, self._listener = self._listener, None
            doomed = list(self._sockets)
            self._sockets.clear()
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone would not)
            except OSError:
                pass
            listener.close()
        for sock in doomed:
            _reset(sock)

    def stall(self) -> None:
        """Carry nothing more: open connections hang, new ones are accepted and never answered."""
        self._flowing.clear()

    def restore(self) -> None:
        """Accept and forward connections again, on the same port."""
        if not self._flowing.is_set():
            with self._lock:
                doomed = list(self._sockets)
                self._sockets.clear()
            for sock in doomed:
                _reset(sock)
            self._flowing.set()
        with self._lock:
            cut, self._cut = self._cut, False
        if cut:
            self._listen()

    def close(self) -> None:
        self.cut()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name=f"fault-proxy-{self.port}", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by cut()
                return
            if not self._flowing.is_set():  # stalled: hold it unanswered until restore()
                with self._lock:
                    self._sockets.add(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                refused = self._cut
                if not refused:
                    self.connections += 1
                    self._sockets.update((client, upstream))
            if refused:  # cut while this one was being connected
                _reset(client)
                _reset(upstream)
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        # One side closed or failed: close both (the other pump then ends too).
        with self._lock:
            self._sockets.discard(source)
            self._sockets.discard(sink)
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def _reset(sock: socket.socket) -> None:
    """Abort a connection: RST to the peer, and wake the pump blocked reading it."""
    for step in (
        lambda: sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET),
        lambda: sock.shutdown(socket.SHUT_RD),
        sock.close,
    ):
        try:
            step()
        except OSError:
            pass

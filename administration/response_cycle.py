"""uvicorn's request-response cycle with less work per response on the gateway's path (issue 27, D86).

:class:`LeanCycle` is uvicorn's :class:`RequestResponseCycle` (the httptools protocol makes one per
request, :class:`~administration.receipt.BoundedHttpToolsProtocol` this one) with two changes that
leave the bytes on the wire as they were:

- **one write for a whole response.** A head that declares a Content-Length (and a body to follow)
  is held until the body's first message and written with it, one ``transport.write`` (one system
  call) where uvicorn made two. A streamed or chunked response's head still goes out at once, so a
  stream's first byte is not delayed; a body that overruns its length writes the head first, as
  uvicorn had. The header checks are uvicorn's, made on all names and all values at once (each
  joined by a byte the check does not refuse) and header by header only when one fails, so the
  same error is raised.
- **the client's leaving told without a task.** :meth:`watch_disconnect` registers a callback the
  protocol calls when the connection is lost while the response is unfinished
  (:class:`~inference.asgi_io.DisconnectWatch` used to keep a task awaiting ``receive`` for that
  message, a task made, woken and cancelled per request). Registering resumes reading as
  ``receive`` would, so the connection's end is seen.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

__all__ = ["LeanCycle"]

_ONE_WRITE_MAX = 2**16  # a body up to this size is joined to its held head (a larger one: two writes)


class LeanCycle(RequestResponseCycle):
    """See the module's docstring. Everything not overridden is uvicorn's."""

    # The disconnect watch's callback (at most one), and the head held for the body's first bytes.
    disconnect_callback: Callable[[], None] | None = None
    _head: bytes | None = None
    # The connection's event loop (set by the protocol): a watch finds its task with it, where
    # asyncio.current_task() alone costs a getpid() system call on Python 3.11.
    loop: asyncio.AbstractEventLoop | None = None

    # --- the client's leaving ---------------------------------------------------------------------
    def watch_disconnect(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once if the client leaves before the response completes; False (nothing
        registered) when it already left, the response completed or another watch is registered."""
        if self.disconnected or self.response_complete or self.disconnect_callback is not None:
            return False
        self.flow.resume_reading()  # as receive() does: a connection not read would not show its end
        self.disconnect_callback = callback
        return True

    def unwatch_disconnect(self) -> None:
        self.disconnect_callback = None

    def client_left(self) -> None:
        """The protocol marked the cycle disconnected (connection lost, or refused mid-body)."""
        callback = self.disconnect_callback
        if callback is not None and self.disconnected:
            self.disconnect_callback = None
            callback()

    # --- ASGI send --------------------------------------------------------------------------------
    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()  # pragma: no cover - as uvicorn's

        if self.disconnected:
            return

        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self.response_started = True
            self.waiting_for_100_continue = False
            status_code = message["status"]
            headers = [*self.default_headers, *message.get("headers", ())]
            if self.access_log:
                self.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d',
                    get_client_addr(self.scope),
                    self.scope["method"],
                    get_path_with_query_string(self.scope),
                    self.scope["http_version"],
                    status_code,
                )
            # uvicorn's checks on all at once: 0x80 and tab are bytes neither check refuses.
            if HEADER_RE.search(b"\x80".join([name for name, _ in headers])) or HEADER_VALUE_RE.search(
                b"\t".join([value for _, value in headers])
            ):
                for name, value in headers:  # the first offending header's error, as uvicorn raises it
                    if HEADER_RE.search(name):
                        raise RuntimeError("Invalid HTTP header name.")
                    if HEADER_VALUE_RE.search(value):
                        raise RuntimeError("Invalid HTTP header value.")
            content = [STATUS_LINE[status_code]]
            has_connection_close = False
            for name, value in headers:
                name = name.lower()
                if name == b"content-length" and self.chunked_encoding is None:
                    self.expected_content_length = int(value.decode())
                    self.chunked_encoding = False
                elif name == b"transfer-encoding" and value.lower() == b"chunked":
                    self.expected_content_length = 0
                    self.chunked_encoding = True
                elif name == b"connection":
                    connection = [token.lower().strip() for token in value.split(b",")]
                    if b"close" in connection:
                        self.keep_alive = False
                        has_connection_close = True
                content.extend((name, b": ", value, b"\r\n"))
            if not self.keep_alive and not has_connection_close:
                content.append(b"connection: close\r\n")
            head_only = self.scope["method"] == "HEAD"
            if self.chunked_encoding is None and not head_only and status_code not in (204, 304):
                self.chunked_encoding = True
                content.append(b"transfer-encoding: chunked\r\n")
            content.append(b"\r\n")
            if self.chunked_encoding is False and self.expected_content_length > 0 and not head_only:
                self._head = b"".join(content)  # written with the body's first bytes
            else:
                self.transport.write(b"".join(content))

        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            elif self.chunked_encoding:
                if body:
                    content = [b"%x\r\n" % len(body), body, b"\r\n"]
                else:
                    content = []
                if not more_body:
                    content.append(b"0\r\n\r\n")
                self.transport.write(b"".join(content))
            else:
                num_bytes = len(body)
                head = self._head
                if head is not None:
                    self._head = None
                if num_bytes > self.expected_content_length:
                    if head is not None:
                        self.transport.write(head)
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= num_bytes
                if head is None:
                    self.transport.write(body)
                elif num_bytes <= _ONE_WRITE_MAX:
                    self.transport.write(head + body)
                else:
                    self.transport.write(head)
                    self.transport.write(body)

            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                self.message_event.set()
                if not self.keep_alive:
                    self.transport.close()
                self.on_response()

        else:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")

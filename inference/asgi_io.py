"""The few raw-ASGI helpers every data-plane surface needs: headers, bounded body reads, JSON and error
responses, and a disconnect watch. Deliberately small; no framework."""

from __future__ import annotations

import asyncio
import re
from random import getrandbits
from typing import Any, Awaitable, Callable, MutableMapping

import orjson

from inference import errors
from inference.errors import GatewayError

__all__ = [
    "ASGIApp",
    "Scope",
    "Receive",
    "Send",
    "ClientDisconnected",
    "ResponseAborted",
    "header",
    "request_id_for",
    "sane_request_id",
    "new_request_id",
    "read_body",
    "parse_json_object",
    "send_response",
    "send_json",
    "send_error",
    "DisconnectWatch",
    "SSE_HEADERS",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)
_JSON = (b"content-type", b"application/json")


class ClientDisconnected(Exception):
    """The client went away before the gateway finished."""


class ResponseAborted(Exception):
    """A response that started cannot be finished truthfully (a whole body relayed as it arrived was
    broken off upstream): raised out of the application so the server closes the connection without
    the body's end, and the client's copy cannot pass for complete. ASGI has no other way to say
    so. Logged by whoever raised it; the servers' own record of it is dropped
    (:class:`administration.servers.AbortedResponses`)."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lowercase bytes), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


# A client's X-Request-ID is kept when it is 1-256 visible ASCII characters: it is echoed in the
# response and written into the worker request's head, so no spaces, controls or line breaks.
_SANE_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,256}")


# Where a request id made for a request is kept in its scope, so a later reader (the escape handler)
# finds the same one.
_MADE_REQUEST_ID = "gw.request_id"


def sane_request_id(given: bytes | None) -> bytes | None:
    """A client's X-Request-ID when it is a sane token to keep, else None."""
    return given if given and _SANE_REQUEST_ID.fullmatch(given) else None


def new_request_id() -> bytes:
    """``req-`` and 96 random bits in hex. An identifier, not a secret: the process's Mersenne Twister
    (reseeded from the OS in every forked child), not ``os.urandom``, whose system call lets go of the
    GIL on the request path and waits to take it back from the flusher's thread (issue 27, D82)."""
    return b"req-%024x" % getrandbits(96)


def request_id_for(scope: Scope) -> bytes:
    """The client's X-Request-ID when it is a sane token, else the one made for this request."""
    given = sane_request_id(header(scope, b"x-request-id"))
    if given is not None:
        return given
    made: bytes | None = scope.get(_MADE_REQUEST_ID)
    if made is None:
        made = scope[_MADE_REQUEST_ID] = new_request_id()
    return made


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """Read the whole request body, refusing (413) anything over ``limit`` bytes."""
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise errors.payload_too_large(limit)
        except ValueError:
            raise errors.invalid_request("Content-Length is not a number") from None
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnected
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise errors.payload_too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise errors.payload_too_large(limit)
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse a JSON object body (400 json_parse_error otherwise)."""
    if not raw:
        raise errors.json_parse_error("Request body is empty; expected a JSON object")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise errors.json_parse_error(f"Request body is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise errors.json_parse_error("Request body must be a JSON object")
    return value


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, payload: Any, request_id: bytes | None = None
) -> None:
    headers = [_JSON]
    if request_id is not None:
        headers.append((b"x-request-id", request_id))
    await send_response(send, status, orjson.dumps(payload), headers)


async def send_error(send: Send, error: GatewayError, request_id: bytes | None = None) -> None:
    headers, body = errors.render_json(error, request_id)
    await send_response(send, error.status, body, headers)


class DisconnectWatch:
    """Cancels the current task when the client disconnects; use around upstream work.

    Start it after the body is read. ``stop()`` before sending the final body message (after the
    response completes, servers report ``http.disconnect`` too). ``fired`` tells whether the
    cancellation came from a disconnect.

    Under uvicorn the request's cycle (:class:`administration.response_cycle.LeanCycle`, the owner of
    ``receive``) calls back when the client leaves: no task per request (issue 27, D86). Elsewhere
    (daphne, tests' own ``receive``) a task waits on ``receive`` for ``http.disconnect``.
    """

    __slots__ = ("_task", "_target", "_cycle", "fired")

    def __init__(self, receive: Receive) -> None:
        self.fired = False
        self._task: asyncio.Task[None] | None = None
        self._cycle: Any = None
        cycle: Any = getattr(receive, "__self__", None)
        watch = getattr(cycle, "watch_disconnect", None)
        if watch is not None:
            # The cycle's loop: asyncio.current_task() without one is a getpid() call on Python 3.11.
            self._target = asyncio.current_task(cycle.loop)
            if watch(self._left):
                self._cycle = cycle
                return
        else:
            self._target = asyncio.current_task()
        self._task = asyncio.ensure_future(self._watch(receive))

    def _left(self) -> None:
        """The cycle's callback: the client left while this watch was on."""
        self._cycle = None
        if self._target is not None:
            self.fired = True
            self._target.cancel()

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if self._task is not None and self._target is not None:
                    self.fired = True
                    self._target.cancel()
                return

    def stop(self) -> None:
        cycle, self._cycle = self._cycle, None
        if cycle is not None:
            cycle.unwatch_disconnect()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

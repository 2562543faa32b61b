"""HTTP workers: relay the request with aiohttp and the worker's answer back, streaming as it arrives.

One ClientSession per event loop (created lazily: daphne sends no lifespan events), whose connector
pools connections per worker host. Closing the response on cancellation closes the upstream
connection, which is how a client disconnect reaches the worker.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter

import aiohttp
import orjson
from yarl import URL

from inference.api.asgi_io import SSE_HEADERS, Send
from inference.backends.base import Backend, FinalHook, RelayRequest, Upstream, UpstreamFailure

__all__ = ["HttpBackend"]

log = logging.getLogger(__name__)

_DONE = b"data: [DONE]\n\n"
_DONE_MARK = b"[DONE]"
_CONNECT_TIMEOUT_SECS = 10.0


class HttpBackend(Backend):
    transport = "http"

    def __init__(self, request_timeout_secs: float) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout_secs, connect=_CONNECT_TIMEOUT_SECS, sock_connect=_CONNECT_TIMEOUT_SECS
        )
        self._request_timeout_secs = request_timeout_secs
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._urls: dict[tuple[str, str], URL] = {}

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=500, keepalive_timeout=30, enable_cleanup_closed=True)
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # a relay keeps no cookies
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                read_bufsize=2**16,
            )
            self._sessions[loop] = session
        return session

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    def _headers(self, request: RelayRequest) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "X-Request-ID": request.request_id.decode()}
        for name, value in request.headers:
            headers[name] = value
        key = request.worker.record.api_key
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if request.stream:
            headers["Accept"] = "text/event-stream"
        return headers

    def _failure(self, exc: BaseException) -> UpstreamFailure:
        if isinstance(exc, asyncio.TimeoutError):
            return UpstreamFailure("timeout", "timed out", self._request_timeout_secs)
        if isinstance(exc, aiohttp.ClientConnectorError):
            return UpstreamFailure("connect", f"cannot connect to {exc.host}:{exc.port}")
        return UpstreamFailure("broken", type(exc).__name__)

    def _url(self, base: str, path: str) -> URL:
        """The worker URL for a route, parsed once (URL parsing is a visible share of a relay)."""
        url = self._urls.get((base, path))
        if url is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            url = self._urls[(base, path)] = URL(base + path)
        return url

    async def open(self, request: RelayRequest) -> Upstream:
        try:
            response = await self.session().post(
                self._url(request.worker.url, request.path), data=request.body, headers=self._headers(request)
            )
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._failure(exc) from None
        return Upstream(response.status, response.headers.get("Content-Type", ""), response)

    async def discard(self, upstream: Upstream) -> None:
        upstream.handle.close()

    async def forward(self, upstream: Upstream, request: RelayRequest, send: Send, before_final: FinalHook) -> bool:
        response: aiohttp.ClientResponse = upstream.handle
        try:
            if request.stream and upstream.status == 200 and upstream.content_type.startswith("text/event-stream"):
                return await self._relay_stream(response, request, send, before_final)
            await self._relay_whole(upstream, response, request, send, before_final)
            return True
        except BaseException:
            # Cancelled (client gone) or failed: drop the upstream connection instead of reusing it.
            response.close()
            raise
        finally:
            response.release()

    async def _relay_whole(
        self, upstream: Upstream, response: aiohttp.ClientResponse, request: RelayRequest, send: Send, before_final: FinalHook
    ) -> None:
        reading = perf_counter()
        try:
            body = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._failure(exc) from None
        headers = [(b"x-request-id", request.request_id)]
        if upstream.content_type:
            headers.append((b"content-type", upstream.content_type.encode("latin-1")))
        if request.on_start is not None:
            request.on_start(headers, perf_counter() - reading)
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        before_final()
        await send({"type": "http.response.body", "body": body})

    async def _relay_stream(
        self, response: aiohttp.ClientResponse, request: RelayRequest, send: Send, before_final: FinalHook
    ) -> bool:
        headers = [*SSE_HEADERS, (b"x-request-id", request.request_id)]
        if request.on_start is not None:
            request.on_start(headers, 0.0)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        tail = b""
        clean = True
        try:
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                tail = (tail + chunk)[-24:] if len(chunk) < 24 else chunk[-24:]
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # The response has started: report the failure in-band, then end the stream.
            failure = self._failure(exc)
            log.warning("upstream stream from %s failed: %s", request.worker.url, failure.detail)
            event = {"error": {"message": f"Worker stream failed: {failure.detail}", "type": "internal_error"}}
            tail = b""
            clean = False
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(event) + b"\n\n", "more_body": True})
        before_final()
        final = b"" if _DONE_MARK in tail else _DONE
        await send({"type": "http.response.body", "body": final})
        return clean

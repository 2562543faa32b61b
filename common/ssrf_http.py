"""The SSRF guard on the wire: an ``httpx2.AsyncClient`` whose every connection passes
:mod:`common.ssrf` and is pinned to the address that passed.

How the pin works: the client's connection pool dials through :class:`GuardedNetworkBackend`. Each
new TCP connection (the first request, a redirect to another origin, a reconnect) resolves the host,
checks **all** its addresses against the policy, then connects to the checked addresses themselves
(in the resolver's order), never to the name again; a DNS answer that changes between check and
connect (rebinding) is never dialled. The URL, the ``Host`` header, TLS SNI and certificate
verification keep the original host name: httpcore derives them from the request's origin, not from
the socket, and pools connections per origin name. The client does not follow redirects (a caller
that follows one makes a new request, checked at its own connect), ignores proxy variables (a proxy
would dial for us, unchecked), refuses schemes other than http and https and Unix sockets, and caps
each answer's body (``max_response_bytes``).

Why a network backend and not a URL rewrite to the IP with an ``sni_hostname`` extension: the
backend keeps pooling, SNI, certificate checks and ``Host`` exactly as httpx does for a name, and it
sees every connection whatever code path (redirect, reconnect, SSE resumption) made it.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Mapping

import anyio
import httpcore2
import httpx2

from common.ssrf import SCHEMES, SsrfPolicy, SsrfRefused, check_host

__all__ = ["GuardedNetworkBackend", "ResponseBudget", "ResponseTooLarge", "guarded_http_client"]


class ResponseTooLarge(httpx2.StreamError):
    """An answer's body exceeded the client's ``max_response_bytes`` (raised while the body is
    read; a stream error, so a library reading answers treats it as one failed answer)."""

    def __init__(self, limit: int):
        super().__init__(f"the answer exceeded {limit} bytes")
        self.limit = limit


class GuardedNetworkBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's network backend with the guard in ``connect_tcp``: resolve, check every address,
    then dial the checked addresses in order. Unix sockets are refused."""

    def __init__(self, policy: SsrfPolicy, inner: httpcore2.AsyncNetworkBackend | None = None) -> None:
        self._policy = policy
        self._inner = inner or httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                addresses = await check_host(host, port, self._policy)
                failure: Exception | None = None
                for address in addresses:
                    try:
                        return await self._inner.connect_tcp(
                            str(address), port, timeout=timeout, local_address=local_address, socket_options=socket_options
                        )
                    except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                        failure = exc
                assert failure is not None
                raise failure
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"connecting to {host!r} timed out") from None
        except OSError as exc:  # the name does not resolve
            raise httpcore2.ConnectError(f"{host!r} does not resolve: {exc}") from None

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        raise SsrfRefused("refused: Unix sockets are not reachable through the guard")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@dataclass(slots=True)
class ResponseBudget:
    """One guarded client's answer cap. ``exceeded`` is set once an answer went over it, so a caller
    whose library turns the exception into a generic error can still tell why a request failed."""

    limit: int | None
    exceeded: bool = False


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, budget: ResponseBudget, limit: int, declared: int) -> None:
        self._inner = inner
        self._budget = budget
        self._limit = limit
        self._declared = declared

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._declared > self._limit:  # refused before a byte of the body is read
            self._budget.exceeded = True
            raise ResponseTooLarge(self._limit)
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                self._budget.exceeded = True
                raise ResponseTooLarge(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, policy: SsrfPolicy, budget: ResponseBudget, limits: httpx2.Limits) -> None:
        super().__init__(verify=_tls_context(), trust_env=False, limits=limits)
        # The pool httpx2 builds for these arguments, with the guard as its network backend.
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=_tls_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedNetworkBackend(policy),
        )
        self._budget = budget

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.scheme not in SCHEMES:
            raise SsrfRefused(f"refused: the scheme must be http or https, not {request.url.scheme!r}")
        response = await super().handle_async_request(request)
        limit = self._budget.limit
        if limit is None:
            return response
        declared = response.headers.get("content-length", "")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _CappedStream(response.stream, self._budget, limit, int(declared) if declared.isdigit() else 0)
        return response


_TLS: ssl.SSLContext | None = None
_TLS_LOCK = threading.Lock()


def _tls_context() -> ssl.SSLContext:
    """One TLS context for every guarded client of the process (building one costs milliseconds)."""
    global _TLS
    if _TLS is None:
        with _TLS_LOCK:
            if _TLS is None:
                _TLS = httpx2.create_ssl_context()
    return _TLS


def guarded_http_client(
    policy: SsrfPolicy,
    *,
    timeout: httpx2.Timeout,
    headers: Mapping[str, str] | None = None,
    max_response_bytes: int | None = None,
    max_connections: int = 4,
    budget: ResponseBudget | None = None,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` whose every connection passes ``policy`` and is pinned to the
    checked address. ``max_response_bytes`` caps each answer's body (:class:`ResponseTooLarge`
    while reading, and ``budget.exceeded`` set); ``max_connections`` bounds the sockets it holds.
    Use it as an async context manager (or ``aclose`` it)."""
    budget = budget if budget is not None else ResponseBudget(max_response_bytes)
    budget.limit = max_response_bytes
    limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx2.AsyncClient(
        transport=_GuardedTransport(policy, budget, limits),
        timeout=timeout,
        headers=dict(headers or {}),
        follow_redirects=False,
        trust_env=False,
    )

"""The control plane's HTTP clients to workers, sized to the fleet: one small httpx client per worker
(one keep-alive connection, one TLS context shared by all), so a probe never scans a pool shared by
a thousand workers, and a bound on how many requests are in flight at once, whose timeouts start only
when a request gets its turn. Health checks and the load monitor each hold one."""

from __future__ import annotations

import asyncio
import ssl
from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpx

__all__ = ["WorkerClients", "MAX_CONCURRENT"]

MAX_CONCURRENT = 64
# A worker's connection is reused only this long: engines close idle keep-alive connections after
# 5 s, and a request written on one as it closes would count as a failure.
_KEEPALIVE_SECS = 4.0
_TLS: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """One TLS context for every client (building one per client costs milliseconds)."""
    global _TLS
    if _TLS is None:
        _TLS = httpx.create_ssl_context()
    return _TLS


class WorkerClients:
    def __init__(self, max_concurrent: int = MAX_CONCURRENT) -> None:
        self.max_concurrent = max_concurrent
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._slots: asyncio.Semaphore | None = None

    def client(self, worker_id: str) -> httpx.AsyncClient:
        found = self._clients.get(worker_id)
        if found is None or found.is_closed:
            found = self._clients[worker_id] = httpx.AsyncClient(
                verify=_tls(),
                trust_env=False,
                follow_redirects=False,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=_KEEPALIVE_SECS),
            )
        return found

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """One of the ``max_concurrent`` places; start a request's timeout inside it."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        async with self._slots:
            yield

    def forget(self, worker_id: str) -> None:
        """The worker left: close its client."""
        client = self._clients.pop(worker_id, None)
        if client is not None:
            asyncio.ensure_future(client.aclose())

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.aclose() for client in clients), return_exceptions=True)

"""The control plane's async HTTP client (httpx): one per event loop, shared by the fan-out routes.
Closed at lifespan shutdown (and when the fleet stops). Every httpx client made for workers shares
one TLS context (``tls_context``): building one costs milliseconds, which a thousand registrations
or per-worker clients would pay a thousand times."""

from __future__ import annotations

import asyncio
import ssl
import weakref

import httpx

from common.tls import client_context

__all__ = ["http_client", "aclose_http_client", "tls_context"]


def tls_context() -> ssl.SSLContext:
    """The one TLS context of the process towards workers (common/tls.py: certifi's roots and
    --ca-cert-paths, verification on, the --client-cert-path chain)."""
    return client_context()


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def http_client() -> httpx.AsyncClient:
    """The httpx client of the running event loop (made on first use)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(verify=tls_context(), trust_env=False, follow_redirects=False)
        _clients[loop] = client
    return client


async def aclose_http_client() -> None:
    """Close this event loop's client."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()

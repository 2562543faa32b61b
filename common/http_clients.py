"""The control plane's async HTTP client (httpx): one per event loop, shared by health checks, the
load monitor and the fan-out routes. Closed at lifespan shutdown (and when the fleet stops)."""

from __future__ import annotations

import asyncio
import weakref

import httpx

__all__ = ["http_client", "aclose_http_client"]

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def http_client() -> httpx.AsyncClient:
    """The httpx client of the running event loop (made on first use)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(trust_env=False, follow_redirects=False)
        _clients[loop] = client
    return client


async def aclose_http_client() -> None:
    """Close this event loop's client."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()

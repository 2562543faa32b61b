"""The gateway's side listeners (spec 3, Probes and metrics).

- GET /metrics on --prometheus-host:--prometheus-port: prometheus_client's own HTTP server in a
  daemon thread, so producing the exposition never blocks the event loop. With
  ``PROMETHEUS_MULTIPROC_DIR`` set it exports the values of every gateway process (see
  :mod:`administration.metrics`); when several processes share a port, the first one to bind serves
  it and the others log that and carry on.
- --health-check-port > 0: /health, /liveness and /readiness on their own aiohttp listener in the
  event loop, answered by the main listener's probe handlers (:mod:`inference.api.probes`) and
  bypassing the HTTP metrics.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, MutableMapping
from wsgiref.simple_server import WSGIServer

from aiohttp import web
from prometheus_client import CollectorRegistry, multiprocess, start_http_server

from administration import metrics
from inference.api.asgi_io import ASGIApp
from inference.api.probes import liveness, readiness

__all__ = ["MetricsListener", "ProbeListener", "exported_registry"]

log = logging.getLogger(__name__)


def exported_registry() -> CollectorRegistry:
    """What /metrics exports: every process's values in multiprocess mode, else this process's."""
    if not metrics.MULTIPROCESS:
        return metrics.REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


class MetricsListener:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Listen; False (logged) when the port is taken, e.g. by another gateway process."""
        try:
            self._server, self._thread = start_http_server(self.port, self.host, registry=exported_registry())
        except OSError as exc:
            log.warning("metrics listener not started on %s:%d: %s", self.host, self.port, exc)
            return False
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)
        return True

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


async def _call_asgi(app: ASGIApp, request: web.Request) -> web.Response:
    """Run a plain ASGI handler (one that needs no request body) for an aiohttp request."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": request.method,
        "path": request.path,
        "query_string": request.query_string.encode("latin-1"),
        "headers": [(k.lower(), v) for k, v in request.raw_headers],
    }
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    body: list[bytes] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = list(message.get("headers") or ())
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await app(scope, receive, send)
    response = web.Response(status=status, body=b"".join(body))
    for key, value in headers:
        if key.lower() != b"content-length":
            response.headers[key.decode("latin-1")] = value.decode("latin-1")
    return response


class ProbeListener:
    """/health, /liveness, /readiness on --health-check-port."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def astart(self) -> None:
        app = web.Application()
        routes: dict[str, ASGIApp] = {"/health": liveness, "/liveness": liveness, "/readiness": readiness}
        for path, handler in routes.items():

            async def serve(request: web.Request, handler: ASGIApp = handler) -> web.Response:
                return await _call_asgi(handler, request)

            app.router.add_route("*", path, serve)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("probes on http://%s:%d/health", self.host, self.port)

    async def astop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

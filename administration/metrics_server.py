"""The gateway's side listeners (spec 3, Probes and metrics).

- GET /metrics on --prometheus-host:--prometheus-port: prometheus_client's own HTTP server in a
  daemon thread, so producing the exposition never blocks the event loop. With
  ``PROMETHEUS_MULTIPROC_DIR`` set it exports the values of every gateway process (see
  :mod:`common.telemetry`) and every process is configured with the same port: the first one
  to bind serves it, the others keep trying once a second, so when the serving process exits another
  takes the port over. One scrape target per host, the same sums whichever process answers, and no
  double counting (each process on its own port would export the same sums several times).
  Without it, a taken port is logged and the process carries on without a listener.
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

from common import telemetry as metrics
from inference.asgi_io import ASGIApp
from inference.escapes import call_guarded
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
    """prometheus_client's HTTP server on ``host:port``. With ``take_over`` (the default in
    multiprocess mode) a port held by another process is retried every ``retry_secs`` until it is
    free or :meth:`stop` is called."""

    def __init__(self, host: str, port: int, take_over: bool | None = None, retry_secs: float = 1.0) -> None:
        self.host = host
        self.port = port
        self.take_over = metrics.MULTIPROCESS if take_over is None else take_over
        self.retry_secs = retry_secs
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._waiter: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def waiting(self) -> bool:
        """Waiting for the port another process holds."""
        return self._waiter is not None and self._waiter.is_alive()

    def start(self) -> bool:
        """Listen; False when the port is taken (logged). With ``take_over``, a background thread
        then waits for the port."""
        try:
            self._bind()
        except OSError as exc:
            if not self.take_over:
                log.warning("metrics listener not started on %s:%d: %s", self.host, self.port, exc)
                return False
            log.info(
                "metrics port %s:%d is taken (%s); another gateway process serves it, this one takes it "
                "over if that process exits", self.host, self.port, exc,
            )
            self._waiter = threading.Thread(target=self._wait_for_port, name="metrics-port-waiter", daemon=True)
            self._waiter.start()
            return False
        return True

    def _bind(self) -> None:
        self._server, self._thread = start_http_server(self.port, self.host, registry=exported_registry())
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    def _wait_for_port(self) -> None:
        while not self._stopping.wait(self.retry_secs):
            try:
                self._bind()
            except OSError:
                continue
            return

    def stop(self) -> None:
        self._stopping.set()
        if self._waiter is not None:
            self._waiter.join(timeout=5)
            self._waiter = None
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

    await call_guarded(app, scope, receive, send)
    response = web.Response(status=status, body=b"".join(body))
    for key, value in headers:
        if key.lower() != b"content-length":
            response.headers[key.decode("latin-1")] = value.decode("latin-1")
    return response


class ProbeListener:
    """/health, /liveness, /readiness on --health-check-port. ``shared``: the serving processes of a
    supervised gateway all bind the port (SO_REUSEPORT) and the kernel spreads the probes over them."""

    def __init__(self, host: str, port: int, shared: bool = False) -> None:
        self.host = host
        self.port = port
        self.shared = shared
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
            await web.TCPSite(runner, self.host, self.port, reuse_port=self.shared or None).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("probes on http://%s:%d/health", self.host, self.port)

    async def astop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

"""Start and stop the gateway's background parts with the server.

uvicorn sends ASGI lifespan events. daphne does not: ``manage.py rungateway --server daphne`` ties
start and stop to Twisted's reactor instead, and under a bare ``daphne`` command the first request
starts them. Either way the worker registry is loaded before any request is routed, unless the
store does not answer: then the process starts without it, routes nothing and answers /readiness
with 503 (waiting for the store) until the registry is loaded (administration/registry_sync.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from django.conf import settings

from administration.discovery_providers import discovery_provider_for
from administration.discovery_reconcile import DiscoveryRunner
from administration.host import host_peers
from administration.metrics_server import MetricsListener, ProbeListener
from administration.registry_sync import RegistrySync
from administration.usage_flush import UsageFlusher, fit_ledger
from common import telemetry, tracing
from common import tls
from common.config import current_config
from common.start_collector import resume_after_start
from common.http_clients import aclose_http_client
from inference.api.routes import data_plane_paths
from inference.asgi_io import ASGIApp, Receive, Scope, Send
from inference.dataplane import data_plane, reset_data_plane
from inference.escapes import answer_escape, call_guarded
from inference.gauges import sample_live_gauges

__all__ = ["BackgroundWork", "GatewayLifecycle", "LIFECYCLE", "apply_log_level", "GATEWAY_LOGGERS"]

# (young objects before a pass, young passes per middle pass, middle passes per full pass)
GC_THRESHOLDS: tuple[int, int, int] = (10_000, 10, 10)

log = logging.getLogger("administration.lifecycle")

GATEWAY_LOGGERS = ("inference", "administration", "responses_api", "common")


def apply_log_level(level: str) -> None:
    """Give the gateway's loggers the --log-level. Called by the command and again when serving
    starts: loading the ASGI application sets Django up, which re-applies settings.LOGGING."""
    for name in GATEWAY_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())


class BackgroundWork(Protocol):
    """Work a process runs outside any request (background responses): drained with the requests on
    shutdown, then stopped."""

    def __len__(self) -> int: ...

    async def aclose(self) -> None: ...


class GatewayLifecycle:
    def __init__(self) -> None:
        self.started = False
        self.in_flight = 0  # HTTP requests being answered by this process (drained on shutdown)
        self.background: list[BackgroundWork] = []  # composed by the project (gateway_project.asgi)
        self.fleet: RegistrySync | None = None
        self.metrics: MetricsListener | None = None
        self.probes: ProbeListener | None = None
        self.usage: UsageFlusher | None = None  # writes the data plane's usage ledger to the store
        self.discovery: DiscoveryRunner | None = None  # worker discovery, run by the host's leader (D73)
        self._sampler: asyncio.Task[None] | None = None
        self._tls_watch: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None

    async def astart(self) -> None:
        if self.started:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.started:
                return
            config = current_config()
            apply_log_level(config.log_level)
            peers = host_peers()
            # A supervised gateway's serving processes split its limits between them.
            shares = config.share(peers.index, peers.count, bool(settings.REDIS_URL)) if peers else config
            reset_data_plane(shares)
            telemetry.configure(config.prometheus_duration_buckets)
            tracing.configure(config.enable_trace, config.otlp_traces_endpoint)  # this process's exporter (D74)
            if config.health_check_port > 0:
                probes = ProbeListener(config.host, config.health_check_port, shared=peers is not None)
                await probes.astart()
                self.probes = probes
            self.fleet = RegistrySync(config, peers)
            snapshot = await self.fleet.astart()
            fit_ledger(data_plane(), config)
            fleet = self.fleet
            self.usage = UsageFlusher(config, lambda: data_plane().ledger, lambda: fleet.leading)
            self.usage.start()
            provider = discovery_provider_for(config)
            if provider is not None:
                self.discovery = DiscoveryRunner(provider, lambda: fleet.leading)
                self.discovery.start()
            if config.prometheus_port > 0:
                self.metrics = MetricsListener(config.prometheus_host, config.prometheus_port)
                self.metrics.start()
            self._sampler = asyncio.ensure_future(telemetry.run_sampler(sample_live_gauges))
            self._tls_watch = asyncio.ensure_future(tls.watch())  # certificate files reloaded when they change (D75)
            if data_plane().waiting_for is None:
                log.info("gateway started: %d worker(s) registered, policy %s", len(snapshot.workers), config.policy)
            else:  # the registry sync said what it waits for; the snapshot comes when it answers
                log.info("gateway started, policy %s; waiting for the %s", config.policy, data_plane().waiting_for)
            self.started = True
            # Everything alive now (settings, apps, migrations, templates) lives as long as the
            # process: kept out of the collector's full passes, which otherwise stall requests; the
            # collector, paused through the start by manage.py rungateway, on again (D118).
            # A relayed request allocates a few hundred container objects: at CPython's default of
            # 700 the collector ran every few requests and its older passes walked the whole fleet's
            # records, the larger share of a request's cost at 1,000 workers (D27).
            resume_after_start(GC_THRESHOLDS)

    async def astop(self) -> None:
        if self._tls_watch is not None:
            self._tls_watch.cancel()
            await asyncio.gather(self._tls_watch, return_exceptions=True)
            self._tls_watch = None
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
            self._sampler = None
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)
            self.metrics = None
        if self.probes is not None:
            await self.probes.astop()
            self.probes = None
        telemetry.mark_process_dead()
        if self.discovery is not None:
            await self.discovery.astop()
            self.discovery = None
        for work in self.background:  # before the engines' channels close under it
            await work.aclose()
        if self.usage is not None:  # the last flush: after every request and background run ended
            await self.usage.astop()
            self.usage = None
        if self.fleet is not None:
            await self.fleet.astop()
        await data_plane().aclose()
        await aclose_http_client()
        await asyncio.to_thread(tracing.shutdown)  # the spans still batched are exported
        self.started = False
        log.info("gateway stopped")

    async def lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.astart()
                except Exception as exc:  # report it and let the server exit
                    log.exception("gateway failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.astop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def begin_drain(self) -> None:
        """Shutting down: /readiness answers 503 from now on (the server stops accepting)."""
        if not self.started:
            return
        data_plane().draining = True
        log.info("draining: %d request(s) in flight", self.in_flight)

    def _busy(self) -> int:
        return self.in_flight + sum(len(work) for work in self.background)

    async def await_idle(self, timeout_secs: float) -> None:
        """Until no request is in flight and no background work runs, or ``timeout_secs`` passed
        (then they are cut off)."""
        deadline = asyncio.get_running_loop().time() + timeout_secs
        while self._busy() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if self._busy():
            log.warning("shutdown grace period over: %d request(s) and background run(s) cut off", self._busy())

    def gate(self, app: ASGIApp, timed_paths: frozenset[str] | None = None) -> ASGIApp:
        """Wrap the HTTP app so the first request starts the gateway when no lifespan came, and an
        exception escaping any route is answered with the 500 envelope (:mod:`inference.escapes`).
        ``timed_paths``: the data plane's fixed paths (default: inference's)."""

        # Data-plane requests are counted and timed here by their route (their patterns are fixed
        # paths); Django's routes are covered by django-prometheus, unmatched paths are not recorded.
        timed = data_plane_paths() if timed_paths is None else timed_paths

        async def gated(scope: Scope, receive: Receive, send: Send) -> None:
            if not self.started:
                await self.astart()
            self.in_flight += 1
            try:
                path = scope.get("path")
                if path not in timed:
                    await call_guarded(app, scope, receive, send)
                    return
                timer = telemetry.HttpTimer(path, scope["method"], send)
                try:
                    await app(scope, receive, timer.send)
                except Exception as exc:  # a bug: the 500 envelope, logged once (inference.escapes)
                    await answer_escape(scope, timer.send, exc, timer.responded)
                finally:
                    timer.done()
            finally:
                self.in_flight -= 1

        return gated


LIFECYCLE = GatewayLifecycle()

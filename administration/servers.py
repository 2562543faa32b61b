"""Run the gateway's ASGI application in this process under uvicorn (default) or daphne, on
``--host``/``--port`` or on a listening socket inherited from the supervisor (``--workers N``).

Both drain on SIGTERM/SIGINT: the listener closes at once (new connections are refused once every
process sharing it has closed it), /readiness answers 503, requests and streams in flight may finish
for ``--shutdown-grace-period-secs``, then the lifespan shutdown closes upstream clients and channels.
uvicorn does this itself (its graceful shutdown, bounded by ``timeout_graceful_shutdown``); under
daphne a Twisted shutdown trigger stops the listeners, waits for the requests in flight and then
stops the gateway.

With ``--tls-cert-path`` both serve HTTPS (common/tls.py): the certificate files are checked every
few seconds and a changed chain is presented to new connections, without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
from types import FrameType
from typing import Any

import uvicorn

from administration.lifecycle import LIFECYCLE
from administration.receipt import ReceiptLimits, bounded_protocol
from common.config import GatewayConfig
from common.ticks import next_mark
from common.tls import server_certificate
from inference.asgi_io import ResponseAborted

__all__ = ["AbortedResponses", "run_uvicorn", "run_daphne"]

log = logging.getLogger("administration.lifecycle")

APP = "gateway_project.asgi:application"


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, marking the gateway as draining the moment the signal arrives.

    Its main loop wakes once a second, on the second (a mark of the background loops' grid,
    common/ticks.py), where uvicorn's slept 0.1 s at a time to look for the exit signal and did its
    work (the Date header) every tenth wake: nine of ten wakes of an idle process for nothing (D94).
    The signal wakes the loop itself, at once."""

    TICK_SECS = 1.0  # uvicorn's on_tick work is once a second: counters step by its ten ticks
    _tick_waiter: asyncio.Future[None] | None = None
    _tick_loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        LIFECYCLE.begin_drain()
        super().handle_exit(sig, frame)
        waiter, loop = self._tick_waiter, self._tick_loop
        if waiter is not None and loop is not None:
            loop.call_soon_threadsafe(_wake, waiter)

    async def main_loop(self) -> None:
        loop = self._tick_loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # uvicorn's counter, in its 0.1 s ticks
            waiter: asyncio.Future[None] = loop.create_future()
            self._tick_waiter = waiter
            timer = loop.call_at(next_mark(loop.time(), 0.0, self.TICK_SECS), _wake, waiter)
            if not self.should_exit:  # a signal before the waiter existed
                await waiter
            timer.cancel()
            self._tick_waiter = None
            should_exit = await self.on_tick(counter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class AbortedResponses(logging.Filter):
    """On a server's logger: its record of a :class:`~inference.asgi_io.ResponseAborted` is dropped
    (the gateway logged why it ended the response; the server only closed the connection, as asked)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ResponseAborted))


def run_uvicorn(config: GatewayConfig, sock: socket.socket | None = None) -> None:
    # --tls-cert-path: a context of ours, which hands each new connection the newest chain (D75)
    certificate = server_certificate(config)
    tls: dict[str, Any] = {"ssl_context_factory": lambda *_: certificate.ssl_context()} if certificate else {}
    server = _DrainingServer(
        uvicorn.Config(
            APP,
            host=config.host,
            port=config.port,
            loop="uvloop",
            http=bounded_protocol(ReceiptLimits.of(config)),  # httptools, with bounded receipt (D30)
            lifespan="on",
            access_log=False,
            log_level=config.log_level,
            timeout_keep_alive=75,
            timeout_graceful_shutdown=math.ceil(config.shutdown_grace_period_secs),
            server_header=False,
            **tls,
        )
    )
    logging.getLogger("uvicorn.error").addFilter(AbortedResponses())
    server.run(sockets=[sock] if sock is not None else None)


def run_daphne(config: GatewayConfig, fd: int | None = None) -> None:
    # Imported here: importing daphne's server installs Twisted's asyncio reactor, which only a daphne
    # process wants.
    from daphne.cli import CommandLineInterface

    import daphne.server

    from administration.receipt_twisted import bounded_factory  # Twisted's web module: a daphne process's (D118)

    # daphne builds its HTTP factory by this name in Server.run: ours bounds request receipt (D30).
    daphne.server.HTTPFactory = bounded_factory(ReceiptLimits.of(config))
    logging.getLogger("daphne.server").addFilter(AbortedResponses())
    certificate = server_certificate(config)
    if certificate is not None:  # daphne listens on our TLS endpoint, whose connections take the newest chain (D75)
        daphne.server.serverFromString = (
            lambda reactor, description: certificate.twisted_endpoint(reactor, config.host, config.port, fd)
        )
    cli = CommandLineInterface()
    _tie_lifecycle_to_twisted(cli, config.shutdown_grace_period_secs)
    verbosity = "2" if config.log_level == "debug" else "1"
    where = ["--fd", str(fd)] if fd is not None else ["-b", config.host, "-p", str(config.port)]
    cli.run([*where, "-v", verbosity, APP])


def _tie_lifecycle_to_twisted(cli: Any, grace_secs: float) -> None:
    """daphne sends no ASGI lifespan events: start the gateway's background parts (fleet, health
    checks, metrics listener) when Twisted's reactor starts, not on the first request, and stop them
    (closing the upstream sessions, dropping this process's live gauges) before it shuts down.

    SIGTERM and SIGINT drain first: Twisted's own handlers would stop the reactor at once, and
    daphne cancels every application instance on shutdown, cutting streams off. Ours stop the
    listeners, let the requests in flight finish (at most ``grace_secs``) and only then stop the
    reactor; a second signal stops it at once."""
    from daphne.server import twisted_loop  # importing daphne.server installs the asyncio reactor
    from twisted.internet import defer
    from twisted.internet import reactor as installed_reactor

    reactor: Any = installed_reactor  # zope interfaces confuse the type checker
    signals = 0

    async def drain() -> None:
        LIFECYCLE.begin_drain()
        server = getattr(cli, "server", None)
        for listening in list(getattr(server, "listeners", None) or ()):  # Deferreds of the ports
            listening.addCallback(lambda port: port.stopListening())
        await LIFECYCLE.await_idle(grace_secs)
        reactor.stop()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            twisted_loop.call_soon_threadsafe(lambda: asyncio.ensure_future(drain(), loop=twisted_loop))
        else:
            reactor.callFromThread(reactor.stop)

    def start() -> defer.Deferred[None]:
        # Twisted installed its signal handlers before the startup callbacks run: ours replace them.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        started: defer.Deferred[None] = defer.Deferred.fromFuture(
            asyncio.ensure_future(LIFECYCLE.astart(), loop=twisted_loop)
        )

        def failed(failure: Any) -> None:
            log.error("gateway failed to start: %s", failure.getErrorMessage())
            reactor.stop()

        started.addErrback(failed)
        return started

    def stop() -> defer.Deferred[None]:
        return defer.Deferred.fromFuture(asyncio.ensure_future(LIFECYCLE.astop(), loop=twisted_loop))

    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger("before", "shutdown", stop)

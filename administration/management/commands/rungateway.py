"""``manage.py rungateway``: run the gateway under uvicorn (default) or daphne."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from administration.lifecycle import LIFECYCLE
from common.config import ConfigError, GatewayConfig, add_gateway_arguments, config_from_namespace, install_config

log = logging.getLogger("administration.lifecycle")

_DJANGO_OPTIONS = {"verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color", "skip_checks"}


class Command(BaseCommand):
    help = "Run the inference gateway (data plane, admin console and control-plane APIs) on one port."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_gateway_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        ns = argparse.Namespace(**{k: v for k, v in options.items() if k not in _DJANGO_OPTIONS})
        try:
            config = config_from_namespace(ns)
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        install_config(config)
        logging.getLogger("inference").setLevel(config.log_level.upper())
        logging.getLogger("administration").setLevel(config.log_level.upper())
        if settings.EMBEDDED_DATABASE:
            call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(
            f"gateway listening on http://{config.host}:{config.port} "
            f"({config.server}, {len(config.worker_urls)} worker URL(s), policy {config.policy})"
        )
        self.stdout.flush()
        if config.server == "daphne":
            self._run_daphne(config)
        else:
            self._run_uvicorn(config)

    def _run_uvicorn(self, config: GatewayConfig) -> None:
        import uvicorn

        uvicorn.run(
            "gateway_project.asgi:application",
            host=config.host,
            port=config.port,
            loop="uvloop",
            http="httptools",
            lifespan="on",
            access_log=False,
            log_level=config.log_level,
            timeout_keep_alive=75,
            server_header=False,
        )

    def _run_daphne(self, config: GatewayConfig) -> None:
        from daphne.cli import CommandLineInterface

        _tie_lifecycle_to_twisted()
        verbosity = "2" if config.log_level == "debug" else "1"
        CommandLineInterface().run(
            ["-b", config.host, "-p", str(config.port), "-v", verbosity, "gateway_project.asgi:application"]
        )


def _tie_lifecycle_to_twisted() -> None:
    """daphne sends no ASGI lifespan events: start the gateway's background parts (fleet, health
    checks, metrics listener) when Twisted's reactor starts, not on the first request, and stop them
    (closing the upstream sessions, dropping this process's live gauges) before it shuts down."""
    import asyncio

    from daphne.server import twisted_loop  # importing daphne.server installs the asyncio reactor
    from twisted.internet import defer
    from twisted.internet import reactor as installed_reactor

    reactor: Any = installed_reactor  # zope interfaces confuse the type checker
    def start() -> defer.Deferred[None]:
        started: defer.Deferred[None] = defer.Deferred.fromFuture(asyncio.ensure_future(LIFECYCLE.astart(), loop=twisted_loop))

        def failed(failure: Any) -> None:
            log.error("gateway failed to start: %s", failure.getErrorMessage())
            reactor.stop()

        started.addErrback(failed)
        return started

    def stop() -> defer.Deferred[None]:
        return defer.Deferred.fromFuture(asyncio.ensure_future(LIFECYCLE.astop(), loop=twisted_loop))

    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger("before", "shutdown", stop)

"""``manage.py rungateway``: run the gateway under uvicorn (default) or daphne; with ``--workers N``
(N > 1) supervise N serving processes on the one port (administration/supervisor.py)."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from administration.lifecycle import apply_log_level
from administration.servers import run_daphne, run_uvicorn
from administration.supervisor import Supervisor, end_with_supervisor, inherited_socket, received_config
from inference.mcp import McpConfigError, mcp_config_of
from inference.pipeline.parsers import UnknownParser, check_parser_names
from common.start_collector import resume_after_start
from common.tls import check_files
from common.config import ConfigError, GatewayConfig, add_gateway_arguments, config_from_namespace, install_config

_DJANGO_OPTIONS = {"verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color", "skip_checks"}


class Command(BaseCommand):
    help = "Run the inference gateway (data plane, admin console and control-plane APIs) on one port."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_gateway_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        sock = inherited_socket()
        if sock is not None:  # a serving process of a supervised gateway: its config comes from the supervisor
            end_with_supervisor()
            config = received_config()
            apply_log_level(config.log_level)
            self._serve(config, sock)
            return
        ns = argparse.Namespace(**{k: v for k, v in options.items() if k not in _DJANGO_OPTIONS})
        try:
            config = config_from_namespace(ns)
            check_parser_names(tool_parser=config.tool_call_parser, reasoning_parser=config.reasoning_parser)
            mcp_config_of(config)  # a bad --mcp-config-path file stops start-up
            check_files(config)  # a TLS file that does not load stops start-up (D75)
        except (ConfigError, UnknownParser, McpConfigError) as exc:
            raise CommandError(str(exc)) from None
        install_config(config)
        apply_log_level(config.log_level)
        if settings.EMBEDDED_DATABASE:
            self._migrate_embedded_store()
        processes = f"{config.workers} processes" if config.workers > 1 else "1 process"
        self.stdout.write(
            f"gateway listening on {'https' if config.tls_cert_path else 'http'}://{config.host}:{config.port} "
            f"({config.server}, {processes}, {len(config.worker_urls)} worker URL(s), policy {config.policy})"
        )
        self.stdout.flush()
        if config.workers > 1:
            resume_after_start()  # the supervisor serves nothing: its collector on again (D118)
            manage_py = Path(settings.BASE_DIR) / "manage.py"
            raise SystemExit(Supervisor(config, manage_py, Path(settings.DATA_DIR)).run())
        self._serve(config, None)

    def _migrate_embedded_store(self) -> None:
        """Bring the embedded store up to date, saying so when there is work (a first run applies
        every migration, which takes a while on a slow disk) and staying quiet when there is none."""
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if not pending:
            return
        self.stdout.write(f"applying {len(pending)} migration(s) to the embedded store {settings.DATABASES['default']['NAME']}")
        self.stdout.flush()
        call_command("migrate", interactive=False, verbosity=1)
        gc.collect()  # the migrations' states, not frozen with the start's objects (D118)

    @staticmethod
    def _serve(config: GatewayConfig, sock: Any) -> None:
        if config.server == "daphne":
            run_daphne(config, sock.fileno() if sock is not None else None)
        else:
            run_uvicorn(config, sock)

"""``manage.py runmockworker``: serve the project's mock OpenAI-compatible worker (a test aid).

Prints ``mock worker serving MODEL on http://HOST:PORT`` once listening; stop it with Ctrl+C/SIGTERM.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from standins.mock_worker import MockWorkerConfig, run_mock_worker

__all__ = ["Command"]


class Command(BaseCommand):
    help = "Run a mock OpenAI-compatible inference worker (SGLang/vLLM stand-in) for tests and benchmarks."
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, required=True, help="TCP port (0 picks a free one)")
        parser.add_argument("--model", required=True, help="model name served and reported")
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
        parser.add_argument(
            "--owned-by",
            default="sglang",
            help="owned_by in /v1/models: sglang, vllm, or anything else for a generic runtime",
        )
        parser.add_argument("--tokens", type=int, default=16, help="completion tokens per response")
        parser.add_argument("--delay-ms", type=float, default=0.0, help="delay before each generated token")
        parser.add_argument(
            "--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health"
        )
        parser.add_argument(
            "--max-model-len", type=int, default=4096, help="context window, reported and enforced"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 <= options["port"] <= 65535:
            raise CommandError("--port must be between 0 and 65535")
        try:
            config = MockWorkerConfig(
                model=options["model"],
                owned_by=options["owned_by"],
                tokens=options["tokens"],
                delay_ms=options["delay_ms"],
                api_key=options["api_key"] or None,
                max_model_len=options["max_model_len"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            run_mock_worker(config, options["host"], options["port"])
        except OSError as exc:  # e.g. the port is taken
            raise CommandError(f"cannot serve on {options['host']}:{options['port']}: {exc}") from None

"""``manage.py runmockprovider``: serve the stand-in of an external provider (a test aid): OpenAI's
routes, and Anthropic's /v1/messages.

Prints ``mock provider serving M1, M2 on http://HOST:PORT`` once listening; stop it with Ctrl+C/SIGTERM.
See :mod:`standins.mock_provider` for what it answers.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from standins.mock_provider import DEFAULT_API_KEY, DEFAULT_MODELS, FLAVOURS, ProviderConfig, run_mock_provider

__all__ = ["Command"]


class Command(BaseCommand):
    help = "Run a stand-in of an external OpenAI-compatible provider (like api.openai.com) for tests."
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, required=True, help="TCP port (0 picks a free one)")
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
        parser.add_argument(
            "--model",
            dest="models",
            action="append",
            default=None,
            help=f"a model served (repeatable; default {' and '.join(DEFAULT_MODELS)})",
        )
        parser.add_argument(
            "--api-key",
            default=DEFAULT_API_KEY,
            help=f"required as 'Authorization: Bearer KEY' on /v1/* (default {DEFAULT_API_KEY})",
        )
        parser.add_argument(
            "--flavour", choices=FLAVOURS, default="openai",
            help="whose API it plays: its /v1/models (and Gemini's /v1/interactions); default openai",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 <= options["port"] <= 65535:
            raise CommandError("--port must be between 0 and 65535")
        try:
            config = ProviderConfig(
                models=tuple(options["models"] or DEFAULT_MODELS), api_key=options["api_key"], flavour=options["flavour"]
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            run_mock_provider(config, options["host"], options["port"])
        except OSError as exc:  # e.g. the port is taken
            raise CommandError(f"cannot serve on {options['host']}:{options['port']}: {exc}") from None

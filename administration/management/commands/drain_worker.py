"""manage.py drain_worker ID|URL: stop new requests to a worker; in-flight ones finish."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from administration.management.commands._worker_command import resolve
from administration.workers import drain_worker


class Command(BaseCommand):
    help = "Drain a worker: no new requests; it stays registered until removed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker", help="worker id or URL")

    def handle(self, *args: Any, **options: Any) -> None:
        worker = drain_worker(resolve(options["worker"]).pk)
        self.stdout.write(self.style.SUCCESS(f"{worker.url} is {worker.status}"))

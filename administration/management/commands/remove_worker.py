"""manage.py remove_worker ID|URL: drain (a ready worker) and remove (the same job as DELETE)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from administration.management.commands._worker_command import resolve, wait_for_job
from administration.workers import WorkerError, remove_worker


class Command(BaseCommand):
    help = "Remove a worker; a ready worker drains for drain_settle_secs first."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker", help="worker id or URL")
        parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for removal (0: don't)")

    def handle(self, *args: Any, **options: Any) -> None:
        worker = resolve(options["worker"])
        try:
            worker = remove_worker(worker.pk)
        except WorkerError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"queued removal of {worker.url}")
        if options["wait"] > 0:
            if wait_for_job(worker, options["wait"]) is not None:
                raise CommandError(f"removal of {worker.url} did not complete")
            self.stdout.write(self.style.SUCCESS(f"removed {worker.url}"))

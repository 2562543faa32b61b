"""manage.py list_workers: the registered workers (as GET /workers lists them)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from administration.workers import job_status, list_workers


class Command(BaseCommand):
    help = "List registered workers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", help="only workers serving this model id or alias")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        workers = list_workers(options["model"])
        if options["json"]:
            rows = [
                {"id": str(w.pk), "url": w.url, "status": w.status, "runtime_type": w.runtime_type,
                 "worker_type": w.worker_type, "model_id": w.model_id or None, "job_status": job_status(w)}
                for w in workers
            ]
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not workers:
            self.stdout.write("no workers registered")
            return
        header = f"{'ID':36}  {'STATUS':9}  {'RUNTIME':10}  {'TYPE':8}  {'MODEL':30}  URL"
        self.stdout.write(header)
        for w in workers:
            self.stdout.write(
                f"{str(w.pk):36}  {w.status:9}  {w.runtime_type:10}  {w.worker_type:8}  {(w.model_id or '-')[:30]:30}  {w.url}"
            )

"""manage.py list_workers: every stored worker, as the console shows them: registered ones (GET
/workers' list) and those whose first registration runs (GET /workers' ``registering``), each with
its status, connection mode and job."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from administration.models import Worker
from administration.workers import every_worker, job_status


def _job(worker: Worker) -> str:
    """The job column: its type and state, and the message of a failed one ("-" when none shows)."""
    job = job_status(worker)
    if job is None:
        return "-"
    text = f"{job['job_type']} {job['status']}"
    return f"{text}: {job['message']}" if job["message"] else text


class Command(BaseCommand):
    help = "List every worker: registered ones and those being registered (not up yet)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", help="only workers serving this model id or alias")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        workers = every_worker(options["model"])
        if options["json"]:
            rows = [
                {"id": str(w.pk), "url": w.url, "status": w.status, "registered": w.registered,
                 "connection_mode": w.transport.value, "runtime_type": w.runtime_type, "worker_type": w.worker_type,
                 "model_id": w.model_id or None, "job_status": job_status(w)}
                for w in workers
            ]
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not workers:
            self.stdout.write("no workers registered")
            return
        header = f"{'ID':36}  {'STATUS':9}  {'MODE':4}  {'RUNTIME':11}  {'TYPE':8}  {'MODEL':30}  {'URL':30}  JOB"
        self.stdout.write(header)
        for w in workers:
            self.stdout.write(
                f"{str(w.pk):36}  {w.status:9}  {w.transport.value:4}  {w.runtime_type:11}  {w.worker_type:8}  "
                f"{(w.model_id or '-')[:30]:30}  {w.url:30}  {_job(w)}"
            )

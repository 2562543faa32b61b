"""manage.py add_worker URL: register a worker (the same job as POST /workers)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from administration.management.commands._worker_command import wait_for_job
from administration.worker_spec import SpecRuleError, SpecTypeError, parse_worker_spec
from administration.workers import WorkerError, create_worker


class Command(BaseCommand):
    help = "Register a worker. Its registration job probes it; a running gateway health-checks it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("url")
        parser.add_argument("--model", action="append", default=[], help="model id served (repeatable)")
        parser.add_argument("--runtime-type", help="sglang, vllm, trtllm, mlx, tokenspeed, generic, external")
        parser.add_argument("--worker-type", help="regular, prefill, decode, encode")
        parser.add_argument("--api-key", help="key the gateway presents to the worker")
        parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
        parser.add_argument("--priority", type=int)
        parser.add_argument("--cost", type=float)
        parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for registration (0: don't)")

    def handle(self, *args: Any, **options: Any) -> None:
        body: dict[str, Any] = {"url": options["url"]}
        if options["model"]:
            body["models"] = [{"id": model} for model in options["model"]]
        labels = {}
        for item in options["label"]:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise CommandError(f"--label expects KEY=VALUE, got {item!r}")
            labels[key] = value
        if labels:
            body["labels"] = labels
        for option, field in (("runtime_type", "runtime_type"), ("worker_type", "worker_type"), ("api_key", "api_key"),
                              ("priority", "priority"), ("cost", "cost")):
            if options[option] is not None:
                body[field] = options[option]
        try:
            worker = create_worker(parse_worker_spec(body))
        except (SpecTypeError, SpecRuleError, WorkerError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"queued registration of {worker.url} as {worker.pk}")
        if options["wait"] <= 0:
            return
        done = wait_for_job(worker, options["wait"])
        if done is None:
            raise CommandError(f"registration of {worker.url} failed; see the log for the reason")
        self.stdout.write(self.style.SUCCESS(
            f"registered {done.url}: runtime {done.runtime_type}, model {done.model_id or '(any)'}, status {done.status}"
        ))

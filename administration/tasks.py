"""Celery tasks: thin adapters over the job runner (administration/job_runner.py)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

import administration.celery_app  # noqa: F401  # the project's app, the default of every thread, before the task binds
from administration.job_runner import run_job

__all__ = ["run_job_task"]


@shared_task(name="administration.run_job", ignore_result=True, acks_late=True)
def run_job_task(name: str, *args: Any) -> None:
    run_job(name, *args)

"""The Django project. Its Celery app (gateway_project/celery.py) is the one app every process sends
and runs jobs through: ``celery -A gateway_project worker`` loads it, a process that sends a job
loads it with the jobs' task (administration/tasks.py imports it first), and ``celery_app`` here
loads it when asked. It is no longer loaded with the settings: a gateway without a broker never
sends a job through Celery, and importing Celery, kombu and their dependencies was 0.1 s of its
start (D118)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    celery_app: Celery

__all__ = ("celery_app",)


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from gateway_project.celery import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

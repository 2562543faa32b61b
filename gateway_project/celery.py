"""``celery -A gateway_project`` finds the project's Celery app here (Celery looks for a ``celery``
submodule of the named package); the app itself is administration/celery_app.py, beside the jobs'
task that binds to it."""

from __future__ import annotations

from administration.celery_app import app

__all__ = ["app"]

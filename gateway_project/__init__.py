"""The Django project. Its Celery app is loaded with it, so the gateway, the Celery worker and the
manage.py commands all send and run jobs through the one configured app (gateway_project/celery.py)."""

from __future__ import annotations

from gateway_project.celery import app as celery_app

__all__ = ("celery_app",)

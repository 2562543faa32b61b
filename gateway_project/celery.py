"""Celery application. With CELERY_BROKER_URL set, jobs go through the broker to
``celery -A gateway_project worker``; without it, the project's job helper runs them in-process."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

app = Celery("gateway_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

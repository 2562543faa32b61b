"""The Celery application: the one app of every process (the gateway, ``celery -A gateway_project
worker`` through gateway_project/celery.py, the manage.py commands), configured from the Django
settings' CELERY_* names.

The jobs' task module (administration/tasks.py) imports it before its task binds, so it exists
wherever a job is sent or run (not with the settings: D118), and it is made the default app of
every thread: the jobs' task (administration/tasks.py, a shared task)
resolves to it on a request's or a job's thread too, not to Celery's unconfigured fallback app. With
CELERY_BROKER_URL set, jobs go through the broker to the worker; without it, the project's job
helper (administration/jobs.py) runs them in-process.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

app = Celery("gateway_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.set_default()

"""One Celery app: the project's, configured from the CELERY_* settings, is the app of every thread,
so a job sent from a request's or a job's thread goes through it (not Celery's fallback app)."""

from __future__ import annotations

import threading

from celery import current_app
from django.conf import settings

from administration.tasks import run_job_task
from administration.celery_app import app as celery_app


def test_every_thread_sends_jobs_through_the_project_app() -> None:
    seen: dict[str, object] = {}

    def look() -> None:
        seen["current"] = current_app._get_current_object()
        seen["task"] = run_job_task.app

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    assert seen == {"current": celery_app, "task": celery_app}
    assert current_app._get_current_object() is celery_app and run_job_task.app is celery_app
    assert "administration.run_job" in celery_app.tasks


def test_the_celery_settings_apply() -> None:
    conf = celery_app.conf
    assert conf.broker_url == settings.CELERY_BROKER_URL
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    assert conf.broker_connection_timeout == settings.BROKER_TIMEOUT_SECS
    assert conf.task_publish_retry_policy == settings.CELERY_TASK_PUBLISH_RETRY_POLICY
    assert conf.broker_connection_retry_on_startup is True

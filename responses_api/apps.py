from __future__ import annotations

from django.apps import AppConfig


class ResponsesApiConfig(AppConfig):
    """Responses API and conversations (spec 2): stored responses and conversations (models.py), the
    history store backends (storage/), the Conversations API (api/, urls.py), the console (admin.py)
    and retention (manage.py purge_history)."""

    name = "responses_api"
    verbose_name = "Responses and conversations"

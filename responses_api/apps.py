from __future__ import annotations

from django.apps import AppConfig


class ResponsesApiConfig(AppConfig):
    """Responses API and conversations (spec 2). Built in a later issue."""

    name = "responses_api"
    verbose_name = "Responses and conversations"

from __future__ import annotations

from django.apps import AppConfig


class AdministrationConfig(AppConfig):
    name = "administration"
    verbose_name = "Gateway administration"
    default_auto_field = "django.db.models.BigAutoField"

from __future__ import annotations

from django.apps import AppConfig


class StandinsConfig(AppConfig):
    name = "standins"
    verbose_name = "Stand-in workers and engines"

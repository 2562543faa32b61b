"""What the store can hold: the integer range of a model field's column.

One range on every supported store: Django's portable column ranges (Postgres' integer types),
which SQLite's 64-bit integers include. A number checked against it can never overflow the store
(an OverflowError on SQLite, a DataError on Postgres: both were 500s).
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations

__all__ = ["column_range"]


def column_range(field: models.Field[Any, Any]) -> tuple[int, int]:
    """(lowest, highest) integer ``field``'s column holds on every supported store."""
    low, high = BaseDatabaseOperations.integer_field_ranges[field.get_internal_type()]
    return int(low), int(high)

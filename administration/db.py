"""Database work from async background code (fleet refreshes, health transitions).

Django connections are per thread and go back to the pool only when closed; a request closes its
own at the end, background work must do it itself. ``arun_db`` runs a sync ORM function on a worker
thread and closes that thread's connections afterwards, so nothing holds a pooled connection. The
embedded SQLite store has no pool: there closing would only make the next call open the file again
(half a millisecond, paid thousands of times while a large fleet registers), so its per-thread
connections stay open.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

__all__ = ["arun_db"]

T = TypeVar("T")


def _closing(func: Callable[..., T], *args: Any) -> T:
    try:
        return func(*args)
    finally:
        if connections["default"].vendor != "sqlite":
            connections.close_all()


async def arun_db(func: Callable[..., T], *args: Any) -> T:
    return await sync_to_async(_closing, thread_sensitive=False)(func, *args)

"""Database work from async background code (fleet refreshes, health transitions).

Django connections are per thread and go back to the pool only when closed; a request closes its
own at the end, background work must do it itself. ``arun_db`` runs a sync ORM function on a worker
thread and closes that thread's connections afterwards, so nothing holds a pooled connection. The
embedded SQLite store has no pool: there closing would only make the next call open the file again
(half a millisecond, paid thousands of times while a large fleet registers), so its per-thread
connections stay open. Every call reports the store's state (:data:`common.outages.STORE`): the
background loops run every second or so, so they see an outage start and end.

:func:`release_connections` is ``close_old_connections`` for threads that outlive their work (the
local job threads): the same rule, so a SQLite connection in good order stays open there too.
:func:`on_store_thread` runs a request's store work on such a long-lived thread (SQLite only):
Django's ASGI handler gives each request's sync code a thread of its own, whose connection would be
opened for that request alone.
"""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from common.outages import STORE

__all__ = ["arun_db", "on_store_thread", "release_connections", "STORE_ERRORS"]

T = TypeVar("T")

# What the store raises when it cannot be reached or dropped a connection (Postgres down, restarting,
# a cut network, no pooled connection in time): an outage, not a bug. Other database errors are bugs.
STORE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def _closing(func: Callable[..., T], *args: Any) -> T:
    """Run ``func``, report the store's state to :data:`common.outages.STORE`, close connections."""
    try:
        result = func(*args)
    except STORE_ERRORS as exc:
        STORE.failed(exc)
        raise
    finally:
        if connections["default"].vendor != "sqlite":
            connections.close_all()
    STORE.recovered()
    return result


async def arun_db(func: Callable[..., T], *args: Any) -> T:
    return await sync_to_async(_closing, thread_sensitive=False)(func, *args)


def release_connections() -> None:
    """Django's ``close_old_connections`` (before and after each job, as a request does), except that
    a SQLite connection in good order is kept for the thread's next job rather than closed at once
    (CONN_MAX_AGE 0): the store has no pool to give it back to, and opening the file again parses its
    schema, about a millisecond of CPU, once per registration's job while a fleet registers. One
    that saw a database error or was left outside autocommit is closed as before; a pooled store's
    connections go back as before."""
    if connections["default"].vendor != "sqlite":
        close_old_connections()
        return
    for connection in connections.all(initialized_only=True):
        if connection.vendor != "sqlite":
            connection.close_if_unusable_or_obsolete()
        elif connection.connection is not None:
            if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
                connection.close()
            elif connection.errors_occurred:  # (SQLite's is_usable() is always True: reopened to be safe)
                connection.close()


_store_pool: list[ThreadPoolExecutor] = []
_store_pool_lock = threading.Lock()


def _store_threads() -> ThreadPoolExecutor:
    """The store threads, made once under a lock: POSTs arrive on threads of their own (Django's
    ASGI handler), and two first ones together must not each make a pool."""
    if not _store_pool:
        with _store_pool_lock:
            if not _store_pool:
                _store_pool.append(ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-store"))
    return _store_pool[0]


def on_store_thread(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` for a request's store work (sync code): on the embedded SQLite store, on a
    long-lived thread that keeps its connection (:func:`release_connections`), since the request's
    own thread is made for that request (Django's ASGI handler) and opening the file parses the
    schema again, about a millisecond of CPU per POST /workers at fleet size. In place on a pooled
    store, and inside a transaction (a test's, ATOMIC_REQUESTS), which the work must see."""
    if connections["default"].vendor != "sqlite" or connections["default"].in_atomic_block:
        return func(*args)
    context = contextvars.copy_context()  # the request's context (tracing, logging) goes with it
    return _store_threads().submit(context.run, _releasing, func, *args).result()


def _releasing(func: Callable[..., T], *args: Any) -> T:
    try:
        return func(*args)
    finally:
        release_connections()

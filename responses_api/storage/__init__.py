"""The history store of this process, chosen by ``--history-backend`` (db, memory or none).

:func:`history_store` builds it from the installed config the first time it is asked for, and again
when another config is installed (``rungateway`` installs one before serving; tests install theirs).
"""

from __future__ import annotations

from typing import Callable

from common.config import GatewayConfig, current_config
from responses_api.storage.base import HistoryStore
from responses_api.storage.db import DatabaseHistoryStore
from responses_api.storage.memory import MemoryHistoryStore
from responses_api.storage.none import NoHistoryStore

__all__ = ["BACKENDS", "HistoryStore", "build_history_store", "history_store", "install_history_store"]

BACKENDS: dict[str, Callable[[GatewayConfig], HistoryStore]] = {
    "db": lambda config: DatabaseHistoryStore(),
    "memory": lambda config: MemoryHistoryStore(config.history_memory_max_entries),
    "none": lambda config: NoHistoryStore(),
}

_store: HistoryStore | None = None
_built_for: GatewayConfig | None = None


def build_history_store(config: GatewayConfig) -> HistoryStore:
    return BACKENDS[config.history_backend](config)


def history_store() -> HistoryStore:
    global _store, _built_for
    config = current_config()
    if _store is None or _built_for is not config:
        _store, _built_for = build_history_store(config), config
    return _store


def install_history_store(store: HistoryStore | None) -> None:
    """Use ``store`` in this process until another config is installed (None: build it again)."""
    global _store, _built_for
    _store = store
    _built_for = current_config() if store is not None else None

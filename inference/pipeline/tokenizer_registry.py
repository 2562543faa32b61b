"""The data plane's view of the tokenizers: which one serves a model, loaded lazily into the one
bounded :class:`TokenizerCache` of this process.

The tokenizers registered through /v1/tokenizers (spec 3) reach every gateway process as a snapshot
(:meth:`TokenizerDirectory.publish`, called by the fleet loop when it reloads the registry; no store
query on a request's path). :func:`tokenizer_for` is what a route calls:

1. ``location`` when the caller has one (the worker's model card or labels, tokenizer_path then
   model_path), with its ``chat_template``;
2. a tokenizer registered under the model's name (completed loads only), with its chat template;
3. --tokenizer-path, then --model-path, with --chat-template;
4. with autoload on (the default), ``fallback``: the model's own source (a gRPC worker's
   GetTokenizer, or the model id as a hub id; the model id itself when the caller gives none).

With --disable-tokenizer-autoload, step 4 is skipped: a model none of 1-3 covers answers 500
tokenizer_not_found. A tokenizer not in the cache starts loading on a thread and the request answers
503 tokenizer_not_ready with Retry-After: 1, as does every request for it until the load ends. A
load that fails answers 500 tokenizer_not_found with the reason for :data:`FAILED_LOAD_HOLD_SECS`,
then the next request tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from django.conf import settings

from common.config import current_config
from inference import errors
from inference.pipeline.tokenizer_sources import resolve_tokenizer_source
from inference.pipeline.tokenizers import CacheKey, ModelTokenizer, TokenizerCache

__all__ = [
    "TokenizerEntry", "TokenizerDirectory", "TokenizerResolver", "TOKENIZERS", "tokenizer_for", "tokenizer_work_dir",
    "FAILED_LOAD_HOLD_SECS", "CACHE_SIZE",
]  # fmt: skip

log = logging.getLogger(__name__)

FAILED_LOAD_HOLD_SECS = 5.0
"""How long a failed load answers 500 before a request may start another."""

CACHE_SIZE = 8
"""Tokenizers one gateway process keeps loaded (least recently used dropped first)."""


def tokenizer_work_dir() -> Path:
    """Where fetched tokenizers (a worker's archive, a hub download without huggingface_hub) go."""
    return Path(settings.DATA_DIR) / "tokenizers"


@dataclass(frozen=True, slots=True)
class TokenizerEntry:
    """One registered tokenizer whose load completed: ``location`` is the local path the job left
    (or the source itself when that path is not on this host), ``chat_template`` its override."""

    id: str
    name: str
    location: str
    chat_template: str | None = None
    vocab_size: int | None = None


class TokenizerDirectory:
    """The registered tokenizers by id and by name, replaced whole by :meth:`publish` (reads are a
    dict lookup on the current mapping; no lock on the request path)."""

    def __init__(self) -> None:
        self._by_name: dict[str, TokenizerEntry] = {}
        self._by_id: dict[str, TokenizerEntry] = {}

    def publish(self, entries: Iterable[TokenizerEntry]) -> None:
        listed = list(entries)
        self._by_name = {entry.name: entry for entry in listed}
        self._by_id = {entry.id: entry for entry in listed}

    def by_name(self, name: str) -> TokenizerEntry | None:
        return self._by_name.get(name)

    def by_id(self, tokenizer_id: str) -> TokenizerEntry | None:
        return self._by_id.get(tokenizer_id)

    def __len__(self) -> int:
        return len(self._by_name)


class TokenizerResolver:
    """This process's tokenizers: the registry snapshot, the one cache, and the recent failures."""

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self.directory = TokenizerDirectory()
        self.cache = TokenizerCache(cache_size, resolve=self._resolve)
        self._failed: dict[CacheKey, tuple[float, str]] = {}
        self._ever_loaded: set[CacheKey] = set()  # loaded once in this process (readiness)
        self._lock = threading.Lock()

    @staticmethod
    def _resolve(location: str) -> Path:
        return resolve_tokenizer_source(location, work_dir=tokenizer_work_dir())

    def publish(self, entries: Iterable[TokenizerEntry]) -> None:
        """Install the registry's completed tokenizers (the fleet loop, after a reload)."""
        self.directory.publish(entries)

    def _choose(
        self, model: str, location: str | None, chat_template: str | None, fallback: str | None
    ) -> tuple[str, str | None] | None:
        if location:
            return location, chat_template
        entry = self.directory.by_name(model)
        if entry is not None:
            return entry.location, entry.chat_template
        config = current_config()
        configured = config.tokenizer_path or config.model_path
        if configured:
            return configured, chat_template or config.chat_template
        if config.disable_tokenizer_autoload:
            return None
        return fallback or model, chat_template or config.chat_template

    def tokenizer_for(
        self,
        model: str,
        *,
        location: str | None = None,
        chat_template: str | None = None,
        fallback: str | None = None,
    ) -> ModelTokenizer:
        """The loaded tokenizer of ``model``; raises GatewayError 503 tokenizer_not_ready (loading,
        Retry-After: 1) or 500 tokenizer_not_found (none, or its load failed). Never blocks."""
        chosen = self._choose(model, location, chat_template, fallback)
        if chosen is None:
            raise errors.tokenizer_not_found(model, "none is registered or configured and autoload is disabled")
        found = self.cache.peek(*chosen)
        if found is not None:
            return found
        key = TokenizerCache.key(*chosen)
        if self._failed:
            with self._lock:
                failure = self._failed.get(key)
                if failure is not None and time.monotonic() - failure[0] < FAILED_LOAD_HOLD_SECS:
                    raise errors.tokenizer_not_found(model, failure[1])
                self._failed.pop(key, None)
        if not self.cache.loading(*chosen):
            pending = self.cache.start(*chosen)
            if pending.done() and pending.exception() is None:
                return pending.result()  # cached between the peek and now
            pending.add_done_callback(lambda done: self._loaded(key, done))
        raise errors.tokenizer_not_ready(model)

    def ready(
        self,
        model: str,
        *,
        location: str | None = None,
        chat_template: str | None = None,
        fallback: str | None = None,
    ) -> bool:
        """Whether a request for ``model`` finds its tokenizer (readiness): it is loaded, or was
        loaded once in this process and only dropped since to make room (more tokenizers than the
        cache holds: the next request reloads it). Otherwise its load starts as a request's would,
        and the answer is False until it ends well. Never blocks; no I/O on the caller's thread."""
        chosen = self._choose(model, location, chat_template, fallback)
        if chosen is None:
            return False
        key = TokenizerCache.key(*chosen)
        if key in self._ever_loaded:
            return True
        try:
            self.tokenizer_for(model, location=location, chat_template=chat_template, fallback=fallback)
        except errors.GatewayError:
            return False
        self._ever_loaded.add(key)
        return True

    def _loaded(self, key: CacheKey, done: Future[ModelTokenizer]) -> None:
        error = done.exception()
        if error is None:
            log.info("tokenizer %s loaded", key[0])
            self._ever_loaded.add(key)
            return
        log.warning("tokenizer %s could not be loaded: %s", key[0], error)
        with self._lock:
            self._failed[key] = (time.monotonic(), str(error))

    def clear(self) -> None:
        """Forget every loaded tokenizer and failure (tests)."""
        self.cache.clear()
        with self._lock:
            self._failed.clear()
            self._ever_loaded.clear()


TOKENIZERS = TokenizerResolver()
"""This process's tokenizers."""


def tokenizer_for(
    model: str, *, location: str | None = None, chat_template: str | None = None, fallback: str | None = None
) -> ModelTokenizer:
    """:meth:`TokenizerResolver.tokenizer_for` of this process."""
    return TOKENIZERS.tokenizer_for(model, location=location, chat_template=chat_template, fallback=fallback)

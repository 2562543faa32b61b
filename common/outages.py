"""Outages of the services the gateway depends on, logged on transition.

Each service (the store, Redis, the broker) has one :class:`Outage` per process, below. Whatever
code talks to the service reports each failure (:meth:`Outage.failed`) and each success
(:meth:`Outage.recovered`); the outage is logged once when it starts (a warning naming the service,
the error and what the gateway does meanwhile) and once when it ends (with its length), never in
between, however many requests or loops run into it. Both lines are warnings, so they appear
together at any log level that shows either. A success while the service is up costs one attribute
read, so the data plane may report on every request.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from common.urls import redact_credentials

__all__ = ["Outage", "STORE", "REDIS", "BROKER", "describe"]

log = logging.getLogger(__name__)

_DETAIL_LIMIT = 200


def describe(exc: BaseException) -> str:
    """An error in one line for the log: its type and first line, any credentials in a URL hidden."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = redact_credentials(text)[:_DETAIL_LIMIT]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Outage:
    """Whether ``service`` is down as this process saw it last, and the two log lines of an outage."""

    def __init__(
        self, service: str, meanwhile: str, retry_secs: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.service = service
        self.meanwhile = meanwhile  # what the gateway does while the service is down
        self.retry_secs = retry_secs  # during an outage, how long callers wait before trying it again
        self.outages = 0  # how many started in this process
        self._since: float | None = None  # monotonic start of the current outage
        self._last_failure = 0.0
        self._lock = threading.Lock()
        self._clock = clock

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        """A call to the service failed: the first failure of an outage logs it."""
        now = self._clock()
        self._last_failure = now
        if self._since is not None:
            return
        with self._lock:
            if self._since is not None:
                return
            self._since = now
            self.outages += 1
        log.warning("%s unavailable (%s); %s until it is back", self.service, describe(exc), self.meanwhile)

    def recovered(self) -> None:
        """A call to the service succeeded: the first success after an outage logs its end."""
        if self._since is None:
            return
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            log.warning("%s reachable again after %.1f s", self.service, self._clock() - since)

    def retry_due(self) -> bool:
        """Whether to call the service now: always while it is up; during an outage once
        ``retry_secs`` passed since the last failure, and then for one caller only (the next pause
        starts as it is told yes), so a single call probes the service while the others take their
        fallback at once instead of all waiting on a service that may not answer."""
        if self._since is None:
            return True
        now = self._clock()
        if now - self._last_failure < self.retry_secs:
            return False
        with self._lock:
            if now - self._last_failure < self.retry_secs:
                return False
            self._last_failure = now
        return True


STORE = Outage(
    "the store (database)",
    "control routes that need it answer 503 and the data plane serves from its last registry snapshot",
    retry_secs=1.0,
)
REDIS = Outage(
    "Redis",
    "tenant rate limits and token budgets are counted in each process alone and registry notices wait for the "
    "store's change log",
    retry_secs=1.0,
)
BROKER = Outage(
    "the Celery broker", "control-plane jobs run in the gateway process that queued them", retry_secs=5.0
)

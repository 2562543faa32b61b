"""Per-worker circuit breaker (spec 3, Circuit breaker): closed, open, half_open.

closed → open when consecutive failures reach the failure threshold; open → half_open once the open
timeout has passed (checked when a request looks at the worker); half_open → closed after the
success threshold of successes; half_open → open on a failure. An open breaker takes the worker out
of selection.

What counts: a connection failure or timeout, and a response whose status is in the worker's
retryable_status_codes but not in its capacity_status_codes. Client 4xx (other than those listed)
and capacity answers never count, nor does an engine's refusal of the request as invalid
(INVALID_ARGUMENT, OUT_OF_RANGE: the client's error, recorded as an answer; D48).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from common import telemetry
from common.config import GatewayConfig

__all__ = ["BreakerState", "Resilience", "CircuitBreaker", "DEFAULT_RETRYABLE", "DEFAULT_CAPACITY"]

DEFAULT_RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
DEFAULT_CAPACITY = frozenset({429})


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class Resilience:
    """A worker's resilience block with the gateway's defaults filled in."""

    failure_threshold: int = 10
    success_threshold: int = 3
    timeout_secs: float = 60.0
    enabled: bool = True
    retryable_statuses: frozenset[int] = field(default_factory=lambda: DEFAULT_RETRYABLE)
    capacity_statuses: frozenset[int] = field(default_factory=lambda: DEFAULT_CAPACITY)

    @classmethod
    def from_config(cls, config: GatewayConfig) -> Resilience:
        """The gateway's --cb-* defaults (a worker's resilience block overrides them)."""
        return cls(
            failure_threshold=config.cb_failure_threshold,
            success_threshold=config.cb_success_threshold,
            timeout_secs=config.cb_timeout_duration_secs,
            enabled=not config.disable_circuit_breaker,
        )

    def counts_as_failure(self, status: int) -> bool:
        return status in self.retryable_statuses and status not in self.capacity_statuses


class CircuitBreaker:
    """One worker's breaker. ``label`` is its worker's metric label (the URL, set by the registry):
    a labelled breaker records its own outcomes and transitions (gw_worker_cb_*)."""

    __slots__ = ("config", "label", "state", "failures", "successes", "opened_at", "transitions")

    def __init__(self, config: Resilience | None = None, label: str = "") -> None:
        self.config = config or Resilience()
        self.label = label
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.successes = 0
        self.opened_at = 0.0
        self.transitions = 0

    def _move(self, state: BreakerState, now: float) -> None:
        old, self.state = self.state, state
        self.transitions += 1
        self.failures = self.successes = 0
        if state is BreakerState.OPEN:
            self.opened_at = now
        if self.label:
            telemetry.record_breaker_transition(self.label, old.value, state.value)

    def allows(self, now: float | None = None) -> bool:
        """Whether the worker may be selected now (moves open → half_open after the timeout)."""
        if self.state is BreakerState.CLOSED or not self.config.enabled:
            return True
        if self.state is BreakerState.OPEN:
            now = time.monotonic() if now is None else now
            if now - self.opened_at < self.config.timeout_secs:
                return False
            self._move(BreakerState.HALF_OPEN, now)
        return True

    def record(self, failed: bool, now: float | None = None) -> None:
        """One outcome of a request to the worker (counted even while the breaker is disabled)."""
        if self.label:
            telemetry.record_breaker_outcome(self.label, failed)
        if not self.config.enabled:
            return
        if failed:
            self.successes = 0
            self.failures += 1
            if self.state is BreakerState.HALF_OPEN or self.failures >= self.config.failure_threshold:
                self._move(BreakerState.OPEN, time.monotonic() if now is None else now)
        else:
            self.failures = 0
            if self.state is BreakerState.HALF_OPEN:
                self.successes += 1
                if self.successes >= self.config.success_threshold:
                    self._move(BreakerState.CLOSED, time.monotonic() if now is None else now)
            elif self.state is BreakerState.OPEN:  # a request already in flight when it opened
                self._move(BreakerState.CLOSED, time.monotonic() if now is None else now)

    def record_status(self, status: int) -> None:
        self.record(self.config.counts_as_failure(status))

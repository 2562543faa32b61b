"""Retries on another worker (spec 1, Limits: buffering; spec 3, resilience).

A request is retried only while its body is replayable (at most --max-buffered-request-bytes) and
before any byte went to the client: after a connection failure or timeout, a worker that broke off
before answering, or one of the retryable statuses below. A request the worker refused as invalid
(a 4xx, an engine's INVALID_ARGUMENT or OUT_OF_RANGE) is not: any worker would refuse it (D48). Backoff grows from
--retry-initial-backoff-ms by --retry-backoff-multiplier up to --retry-max-backoff-ms, with
--retry-jitter-factor of randomness. A worker's retryable_status_codes decide what its breaker
counts, not what is retried.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from common.config import GatewayConfig

__all__ = ["RetryPolicy", "RETRY_STATUSES"]

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 5
    initial_backoff_ms: int = 50
    max_backoff_ms: int = 30000
    multiplier: float = 1.5
    jitter: float = 0.2
    max_replayable_bytes: int = 16 * 1024 * 1024

    @classmethod
    def from_config(cls, config: GatewayConfig) -> RetryPolicy:
        return cls(
            max_retries=0 if config.disable_retries else config.retry_max_retries,
            initial_backoff_ms=config.retry_initial_backoff_ms,
            max_backoff_ms=config.retry_max_backoff_ms,
            multiplier=config.retry_backoff_multiplier,
            jitter=config.retry_jitter_factor,
            max_replayable_bytes=config.max_buffered_request_bytes,
        )

    def allows(self, retries_done: int, body_size: int) -> bool:
        return retries_done < self.max_retries and body_size <= self.max_replayable_bytes

    def backoff_secs(self, retry: int) -> float:
        """The pause before retry number ``retry`` (1 for the first)."""
        base = min(self.initial_backoff_ms * self.multiplier ** (retry - 1), self.max_backoff_ms)
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread)) / 1000.0

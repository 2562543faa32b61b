"""Traffic control before a request reaches a worker: concurrency permits with a FIFO queue, the
in-flight media budget, and per-tenant rate limits (spec 1, Limits)."""

from __future__ import annotations

from inference.admission.admit import Admission
from inference.admission.media import MediaBudget, inline_media_bytes
from inference.admission.permits import PermitPool
from inference.admission.rate_limit import RateDecision, RateLimiter

__all__ = ["Admission", "PermitPool", "MediaBudget", "inline_media_bytes", "RateDecision", "RateLimiter"]

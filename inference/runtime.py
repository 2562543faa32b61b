"""Per-process data-plane state, built once from the config: keys, policies, registry, backends, retries,
and admission (permits, media budget, rate limiter)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from django.conf import settings

from inference.admission import MediaBudget, PermitPool, RateLimiter
from inference.admission.rate_limit import TenantLimits, refit_rate_limiter
from inference.auth import KeyRing
from inference.backends.base import Backend
from inference.backends.http import HttpBackend
from inference.config import GatewayConfig, current_config
from inference.routing.policies import PolicySet
from inference.routing.registry import REGISTRY, WorkerRegistry
from inference.routing.retry import RetryPolicy

__all__ = ["Runtime", "runtime", "reset_runtime"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Runtime:
    config: GatewayConfig
    keys: KeyRing
    policies: PolicySet
    registry: WorkerRegistry
    backends: dict[str, Backend]
    retry: RetryPolicy
    # Traffic control; each is None when its limit is 0 (the default), so the hot path only checks.
    permits: PermitPool | None = None
    media: MediaBudget | None = None
    rate_limiter: RateLimiter | None = None
    # The limits in force (flags + rows stored in the console), and the limiter kept while they come
    # and go so its counters and Redis connections live on; rate_limiter is it, or None while no
    # tenant has a limit. Installed on the event loop by install_tenant_limits, never per request.
    tenant_limits: TenantLimits = field(default_factory=lambda: TenantLimits(0, ()))
    _limiter: RateLimiter | None = None

    @classmethod
    def build(cls, config: GatewayConfig) -> Runtime:
        built = cls(
            config=config,
            keys=KeyRing(config.api_key, config.tenant_api_keys),
            policies=PolicySet.from_config(config),
            registry=REGISTRY,
            backends={"http": HttpBackend(config.request_timeout_secs)},
            retry=RetryPolicy.from_config(config),
            permits=(
                PermitPool(config.max_concurrent_requests, config.queue_size, config.queue_timeout_secs)
                if config.max_concurrent_requests > 0
                else None
            ),
            media=MediaBudget(config.multimodal_max_inflight_bytes) if config.multimodal_max_inflight_bytes > 0 else None,
        )
        built.install_tenant_limits({})
        return built

    def install_tenant_limits(self, stored: Mapping[str, int]) -> None:
        """Apply the limits stored in the console (tenant -> requests per minute) over the flags.
        Called by the fleet loop after it read the rows; a change counts on in the current window."""
        config = self.config
        limits = TenantLimits.combine(config.default_tenant_rate_limit, config.tenant_rate_limits, stored)
        if limits == self.tenant_limits:
            return
        log.info("tenant rate limits (requests/min): default %d, per tenant %s", limits.default, limits.by_tenant)
        self.tenant_limits = limits
        if limits.any:
            self._limiter = refit_rate_limiter(self._limiter, limits, getattr(settings, "REDIS_URL", None))
        self.rate_limiter = self._limiter if limits.any else None

    async def aclose(self) -> None:
        for backend in self.backends.values():
            await backend.close()
        if self._limiter is not None:
            await self._limiter.aclose()


_runtime: Runtime | None = None


def runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        _runtime = Runtime.build(current_config())
    return _runtime


def reset_runtime(config: GatewayConfig | None = None) -> Runtime:
    """Rebuild the runtime (tests, and a server started after the config was installed)."""
    global _runtime
    _runtime = Runtime.build(config or current_config())
    return _runtime

"""Per-process data-plane state, built once from the config: keys, policies, registry, backends, retries,
and admission (permits, media budget, rate limiter)."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from inference.admission import MediaBudget, PermitPool, RateLimiter, build_rate_limiter
from inference.auth import KeyRing
from inference.backends.base import Backend
from inference.backends.http import HttpBackend
from inference.config import GatewayConfig, current_config
from inference.routing.policies import PolicySet
from inference.routing.registry import REGISTRY, WorkerRegistry
from inference.routing.retry import RetryPolicy

__all__ = ["Runtime", "runtime", "reset_runtime"]


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

    @classmethod
    def build(cls, config: GatewayConfig) -> Runtime:
        return cls(
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
            rate_limiter=build_rate_limiter(
                config.default_tenant_rate_limit, config.tenant_rate_limits, getattr(settings, "REDIS_URL", None)
            ),
        )

    async def aclose(self) -> None:
        for backend in self.backends.values():
            await backend.close()
        if self.rate_limiter is not None:
            await self.rate_limiter.aclose()


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

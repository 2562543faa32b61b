"""Per-process data-plane state, built once from the config: keys, policies, registry, backends, retries."""

from __future__ import annotations

from dataclasses import dataclass

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

    @classmethod
    def build(cls, config: GatewayConfig) -> Runtime:
        return cls(
            config=config,
            keys=KeyRing(config.api_key, config.tenant_api_keys),
            policies=PolicySet.from_config(config),
            registry=REGISTRY,
            backends={"http": HttpBackend(config.request_timeout_secs)},
            retry=RetryPolicy.from_config(config),
        )

    async def aclose(self) -> None:
        for backend in self.backends.values():
            await backend.close()


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

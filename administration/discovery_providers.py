"""Which worker discovery provider the flags ask for (docs/DECISIONS.md D73): its own module, since
both providers import the reconcile pass they feed."""

from __future__ import annotations

from administration.discovery_reconcile import DiscoveryProvider
from administration.file_discovery import FileDiscovery
from administration.pod_discovery import PodDiscovery
from common.config import GatewayConfig

__all__ = ["discovery_provider_for"]


def discovery_provider_for(config: GatewayConfig) -> DiscoveryProvider | None:
    """The provider the flags ask for (None: no discovery)."""
    if not config.discovery:
        return None
    if config.discovery_provider == "file":
        return FileDiscovery(config)
    return PodDiscovery(config)

"""Which worker discovery provider the flags ask for (docs/DECISIONS.md D73): its own module, since
both providers import the reconcile pass they feed."""

from __future__ import annotations

from administration.discovery_reconcile import DiscoveryProvider
from administration.file_discovery import FileDiscovery
from common.config import GatewayConfig

__all__ = ["discovery_provider_for"]


def discovery_provider_for(config: GatewayConfig) -> DiscoveryProvider | None:
    """The provider the flags ask for (None: no discovery)."""
    if not config.discovery:
        return None
    if config.discovery_provider == "file":
        return FileDiscovery(config)
    # Imported here: kubernetes_asyncio is the larger share of this import, and a gateway without
    # the Kubernetes provider (most of them) need not pay for it at every start (issue 26 item 5).
    from administration.pod_discovery import PodDiscovery

    return PodDiscovery(config)

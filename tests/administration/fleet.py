"""The registry's fleet loop running in the test's event loop under a given configuration (health
checks, discovery, registration jobs), stopped and the registry emptied afterwards."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

from administration.registry_sync import RegistrySync
from common.config import GatewayConfig, install_config
from inference.routing.registry import REGISTRY


@asynccontextmanager
async def running_fleet(config: GatewayConfig) -> AsyncIterator[RegistrySync]:
    install_config(config, export=False)
    running = RegistrySync(config)
    await running.astart()
    try:
        yield running
    finally:
        await running.astop()
        REGISTRY.publish([], {})
        install_config(GatewayConfig(), export=False)

"""The metrics listener's /metrics read as metric families (``scrape``), for the telemetry tests."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from administration.metrics_server import MetricsListener
from tests.conftest import free_port


@pytest.fixture
async def scrape() -> AsyncIterator:
    listener = MetricsListener("127.0.0.1", free_port())
    assert listener.start()

    async def fetch() -> dict:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"http://127.0.0.1:{listener.port}/metrics")
        assert response.status_code == 200
        return {family.name: family for family in text_string_to_metric_families(response.text)}

    yield fetch
    await asyncio.to_thread(listener.stop)

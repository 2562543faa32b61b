"""External providers as workers (spec 3, worker url and runtime_type; spec 2, per worker kind):
registered through POST /workers or --backend with --worker-urls, their models read from the
provider's /v1/models with the worker's own key, through the SSRF guard; the gateway's own keys
never go to them."""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

import pytest
from django.test import AsyncClient

from administration.models import Worker, WorkerSource
from administration.registry_sync import RegistrySync
from administration.workers import sync_cli_workers, worker_records
from common.config import GatewayConfig, install_config
from inference.routing.registry import REGISTRY
from standins.mock_provider import ProviderConfig
from tests.conftest import PROVIDER_KEY, Provider, serving_provider, until

pytestmark = pytest.mark.django_db(transaction=True)

GUARDED = GatewayConfig(worker_startup_check_interval=0.2, worker_startup_timeout_secs=1.0)
LOOPBACK_ALLOWED = dataclasses.replace(GUARDED, ssrf_allow_loopback=True)


async def start_fleet(config: GatewayConfig) -> RegistrySync:
    install_config(config, export=False)
    running = RegistrySync(config)
    await running.astart()
    return running


@pytest.fixture
async def fleets() -> AsyncIterator[list[RegistrySync]]:
    started: list[RegistrySync] = []
    yield started
    for running in started:
        await running.astop()
    REGISTRY.publish([], {})
    install_config(GatewayConfig(), export=False)


async def registered(api: AsyncClient, body: dict[str, Any]) -> dict[str, Any] | None:
    """The worker once its registration ended: its GET body, or None when it failed (404)."""
    response = await api.post("/workers", body, content_type="application/json")
    assert response.status_code == 202, response.content
    location = response.json()["location"]

    async def ended() -> bool:
        got = await api.get(location)
        return got.status_code == 404 or (got.status_code == 200 and "job_status" not in got.json())

    await until(ended)
    got = await api.get(location)
    return got.json() if got.status_code == 200 else None


async def test_an_external_worker_serves_the_models_its_provider_lists(provider: Provider, fleets: list[RegistrySync]) -> None:
    fleets.append(await start_fleet(LOOPBACK_ALLOWED))
    body = {"url": provider.url, "runtime_type": "external", "api_key": PROVIDER_KEY}
    got = await registered(AsyncClient(), body)
    assert got is not None and got["status"] == "ready" and got["runtime_type"] == "external"
    assert "api_key" not in got and PROVIDER_KEY not in str(got)
    listing = provider.calls("/v1/models")[-1]
    assert listing["headers"]["authorization"] == f"Bearer {PROVIDER_KEY}"

    async def routed() -> bool:
        return {"gpt-4o-mini", "gpt-4.1"} <= set(REGISTRY.snapshot.routable_by_model)

    await until(routed)
    assert REGISTRY.snapshot.routable_models == ()  # GET /v1/models lists self-hosted models only


async def test_a_refused_key_or_a_guarded_address_fails_registration(provider: Provider, fleets: list[RegistrySync]) -> None:
    fleets.append(await start_fleet(GUARDED))
    api = AsyncClient()
    assert await registered(api, {"url": provider.url, "runtime_type": "external", "api_key": PROVIDER_KEY}) is None
    assert provider.state.requests == []  # loopback is refused before any connection
    await fleets.pop().astop()
    fleets.append(await start_fleet(LOOPBACK_ALLOWED))
    assert await registered(api, {"url": provider.url, "runtime_type": "external", "api_key": "sk-wrong"}) is None


@pytest.mark.django_db  # not transactional: the registration jobs queued on commit never run
def test_backend_makes_command_line_workers_external_without_the_gateway_key() -> None:
    sync_cli_workers(["http://provider.example:8080"], "openai")
    worker = Worker.objects.get()
    assert worker.source == WorkerSource.CLI and worker.runtime_type == "external"
    worker.registered = True
    worker.provider_models = ["gpt-4o-mini"]
    record = worker_records(dataclasses.replace(GUARDED, api_key="gw-secret-key"), [worker])[0]
    assert record.api_key is None and record.external and record.served_models == ("gpt-4o-mini",)
    sync_cli_workers(["grpc://engine:1"], "vllm")
    assert Worker.objects.get().runtime_type == "vllm"


# What each provider's model list is asked with and read from (docs ENGINES.md, "External providers").
LISTING_AS_RECEIVED = {
    "anthropic": ("limit=1000", {"x-api-key": PROVIDER_KEY, "anthropic-version": "2023-06-01"}),
    "gemini": ("", {"authorization": f"Bearer {PROVIDER_KEY}"}),
    "xai": ("", {"authorization": f"Bearer {PROVIDER_KEY}"}),
}
# Anthropic lists 20 models a page unless asked for more: 25 prove the whole list was asked for.
FLAVOUR_MODELS = {
    "anthropic": tuple(f"claude-stand-in-{i}" for i in range(25)),
    "gemini": ("gemini-2.5-flash", "gemini-2.5-pro"),
    "xai": ("grok-4", "grok-3-mini"),
}


@pytest.mark.parametrize("flavour", sorted(LISTING_AS_RECEIVED))
async def test_each_provider_lists_its_models_with_its_own_header_and_shape(flavour: str, fleets: list[RegistrySync]) -> None:
    fleets.append(await start_fleet(LOOPBACK_ALLOWED))
    config = ProviderConfig(models=FLAVOUR_MODELS[flavour], api_key=PROVIDER_KEY, flavour=flavour)
    async with serving_provider(config) as provider:
        body = {"url": provider.url, "runtime_type": "external", "api_key": PROVIDER_KEY, "labels": {"provider": flavour}}
        got = await registered(AsyncClient(), body)
        assert got is not None and got["status"] == "ready"
        listing = provider.calls("/v1/models")[-1]
    query, key_headers = LISTING_AS_RECEIVED[flavour]
    own = {"host", "accept", "accept-encoding", "connection", "user-agent"}
    assert listing["query"] == query
    assert {name: value for name, value in listing["headers"].items() if name not in own} == key_headers

    async def routed() -> bool:
        return set(FLAVOUR_MODELS[flavour]) <= set(REGISTRY.snapshot.routable_by_model)

    await until(routed)  # gemini's "models/<id>" listed as the id its requests take


async def test_a_provider_refusing_the_key_in_its_own_header_fails_registration(fleets: list[RegistrySync]) -> None:
    fleets.append(await start_fleet(LOOPBACK_ALLOWED))
    config = ProviderConfig(models=("claude-stand-in",), api_key=PROVIDER_KEY, flavour="anthropic")
    async with serving_provider(config) as provider:
        body = {"url": provider.url, "runtime_type": "external", "api_key": "sk-wrong", "labels": {"provider": "anthropic"}}
        assert await registered(AsyncClient(), body) is None
        assert provider.calls("/v1/models")[-1]["headers"]["x-api-key"] == "sk-wrong"

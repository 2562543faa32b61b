"""GET /v1/models with a caller's own provider key (spec 1, Model list; Authentication): a bearer
token or x-api-key that is not a gateway key asks the registered providers' lists with it (our
stand-in providers on loopback, each checking its own key header as the real one does), the first
non-empty one answers, else the self-hosted list; a gateway key never reaches a provider; the SSRF
guard, the size bound and the time bound hold on that path."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import AsyncIterator

import pytest
from aiohttp import web

from inference.routing.workers import WorkerRecord, WorkerStatus
from standins.mock_provider import ProviderConfig
from tests.conftest import PROVIDER_KEY, GatewayFactory, Provider, RunningWorker, record_for, serving_provider

GATEWAY_KEY = "gw-secret-key"
TENANT_KEY = "gw-tenant-key"
SELF_HOSTED = {"object": "list", "data": [{"id": "mock-model", "object": "model", "created": 0, "owned_by": "self_hosted"}]}


def external(url: str, provider: str, models: tuple[str, ...] = (), api_key: str | None = None) -> WorkerRecord:
    return WorkerRecord(
        id=str(uuid.uuid4()), url=url, model_id=None, runtime_type="external", status=WorkerStatus.READY,
        api_key=api_key, models=models, named_provider=provider,
    )  # fmt: skip


def listed(*ids: str, owner: str) -> dict[str, object]:
    return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": owner} for i in ids]}


def listings(provider: Provider) -> list[dict[str, str]]:
    return [call["headers"] for call in provider.calls("/v1/models")]


def assert_no_gateway_key(*providers: Provider) -> None:
    for provider in providers:
        for request in provider.state.requests:
            assert GATEWAY_KEY not in json.dumps(request["headers"]) and TENANT_KEY not in json.dumps(request["headers"])


@pytest.fixture
async def openai_provider() -> AsyncIterator[Provider]:
    async with serving_provider(ProviderConfig(models=("gpt-4o-mini", "gpt-4.1"), api_key=PROVIDER_KEY)) as running:
        yield running


async def test_a_callers_own_key_lists_the_providers_models(
    make_gateway: GatewayFactory, worker: RunningWorker, openai_provider: Provider
) -> None:
    client = make_gateway(
        [record_for(worker), external(openai_provider.url, "openai", api_key="sk-worker-own")],
        api_key=GATEWAY_KEY, ssrf_allow_loopback=True,
    )  # fmt: skip
    response = await client.get("/v1/models", headers={"Authorization": f"Bearer {PROVIDER_KEY}"})
    assert response.status_code == 200
    assert response.json() == listed("gpt-4o-mini", "gpt-4.1", owner="openai")
    assert listings(openai_provider)[-1]["authorization"] == f"Bearer {PROVIDER_KEY}"  # the caller's, not the worker's


@pytest.mark.parametrize("gateway_key", [GATEWAY_KEY, TENANT_KEY])
async def test_a_gateway_key_is_never_sent_to_a_provider(
    make_gateway: GatewayFactory, worker: RunningWorker, openai_provider: Provider, gateway_key: str
) -> None:
    client = make_gateway(
        [record_for(worker), external(openai_provider.url, "openai")],
        api_key=GATEWAY_KEY, tenant_api_keys=(("acme", TENANT_KEY),), ssrf_allow_loopback=True,
    )  # fmt: skip
    for headers in ({"Authorization": f"Bearer {gateway_key}"}, {"x-api-key": gateway_key}, {}):
        response = await client.get("/v1/models", headers=headers)
        assert response.status_code == 200 and response.json() == SELF_HOSTED
    assert openai_provider.state.requests == []


async def test_beside_a_gateway_bearer_the_x_api_key_is_the_callers_own(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    config = ProviderConfig(models=("claude-stand-in",), api_key=PROVIDER_KEY, flavour="anthropic")
    async with serving_provider(config) as claude:
        client = make_gateway([record_for(worker), external(claude.url, "anthropic")], api_key=GATEWAY_KEY, ssrf_allow_loopback=True)
        headers = {"Authorization": f"Bearer {GATEWAY_KEY}", "x-api-key": PROVIDER_KEY}
        response = await client.get("/v1/models", headers=headers)
        assert response.json() == listed("claude-stand-in", owner="anthropic")
        sent = listings(claude)[-1]
        assert sent["x-api-key"] == PROVIDER_KEY and sent["anthropic-version"] and "authorization" not in sent
        assert_no_gateway_key(claude)


async def test_the_first_non_empty_list_answers(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    refusing = ProviderConfig(models=("grok-4",), api_key="sk-someone-else", flavour="xai")
    gemini = ProviderConfig(models=("gemini-2.5-flash",), api_key=PROVIDER_KEY, flavour="gemini")
    xai = ProviderConfig(models=("grok-3-mini",), api_key=PROVIDER_KEY, flavour="xai")
    async with serving_provider(refusing) as first, serving_provider(gemini) as second, serving_provider(xai) as third:
        records = [record_for(worker), *(external(p.url, n) for p, n in ((first, "xai"), (second, "gemini"), (third, "xai")))]
        client = make_gateway(records, ssrf_allow_loopback=True)  # open mode: every key is the caller's own
        response = await client.get("/v1/models", headers={"Authorization": f"Bearer {PROVIDER_KEY}"})
        assert response.json() == listed("gemini-2.5-flash", owner="gemini")  # Gemini's "models/" prefix dropped
        for provider in (first, second, third):
            assert listings(provider)[-1]["authorization"] == f"Bearer {PROVIDER_KEY}"


async def test_a_key_no_provider_takes_falls_back_to_the_self_hosted_list(
    make_gateway: GatewayFactory, worker: RunningWorker, openai_provider: Provider
) -> None:
    client = make_gateway([record_for(worker), external(openai_provider.url, "openai")], ssrf_allow_loopback=True)
    response = await client.get("/v1/models", headers={"Authorization": "Bearer sk-not-theirs"})
    assert response.json() == SELF_HOSTED
    assert listings(openai_provider)[-1]["authorization"] == "Bearer sk-not-theirs"
    only_provider = make_gateway([external(openai_provider.url, "openai")], ssrf_allow_loopback=True)
    response = await only_provider.get("/v1/models", headers={"Authorization": "Bearer sk-not-theirs"})
    assert response.status_code == 503 and response.text == "No models available"


async def test_the_ssrf_guard_keeps_a_loopback_provider_out(
    make_gateway: GatewayFactory, worker: RunningWorker, openai_provider: Provider
) -> None:
    client = make_gateway([record_for(worker), external(openai_provider.url, "openai")])
    response = await client.get("/v1/models", headers={"Authorization": f"Bearer {PROVIDER_KEY}"})
    assert response.json() == SELF_HOSTED
    assert openai_provider.state.requests == []  # refused before any connection


@pytest.fixture
async def misbehaving() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A "provider" whose /v1/models never answers (/slow) or never ends its body (/endless)."""
    never = asyncio.Event()

    async def slow(_request: web.Request) -> web.Response:
        await never.wait()
        raise AssertionError("unreachable")

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b" " * 2**16
        while True:
            await response.write(chunk)

    app = web.Application()
    app.add_routes([web.get("/slow/v1/models", slow), web.get("/endless/v1/models", endless)])
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", never
    never.set()
    await runner.cleanup()


@pytest.mark.parametrize("route", ["slow", "endless"])
async def test_a_provider_that_never_answers_or_never_ends_is_cut_off(
    make_gateway: GatewayFactory, worker: RunningWorker, misbehaving: tuple[str, asyncio.Event], route: str
) -> None:
    base, _never = misbehaving
    records = [record_for(worker), external(f"{base}/{route}", "openai")]
    client = make_gateway(records, ssrf_allow_loopback=True, request_timeout_secs=1.0)
    response = await client.get("/v1/models", headers={"Authorization": f"Bearer {PROVIDER_KEY}"})
    assert response.status_code == 200 and response.json() == SELF_HOSTED

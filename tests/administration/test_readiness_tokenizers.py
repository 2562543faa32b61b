"""/readiness means ready (issue 21, item 4): a gateway whose gRPC worker is ready answers 503 until
that worker's tokenizer is loaded, then 200, and the first request after the 200 is served (no
503 tokenizer_not_ready). Against a real gRPC engine stand-in registered through POST /workers, with
the gateway's real fleet loop, which starts the load when the worker becomes ready."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import httpx
import pytest

from administration.registry_sync import RegistrySync
from common.config import GatewayConfig, current_config, install_config
from inference.errors import GatewayError
from inference.pipeline import tokenizer_registry
from inference.pipeline.tokenizer_registry import TOKENIZERS, TokenizerResolver
from inference.pipeline.tokenizers import TokenizerLoadError
from inference.routing.registry import REGISTRY
from standins.fixtures import FIXTURE_MODELS
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer
from tests.administration.test_tokenizer_registry import Gate
from tests.conftest import GatewayFactory, RunningWorker, record_for, until

pytestmark = pytest.mark.django_db(transaction=True)

MISTRAL = str(FIXTURE_MODELS / "mistral")  # the smallest fixture tokenizer
MODEL = "mistral-on-grpc"
FAST: dict[str, Any] = dict(
    worker_startup_check_interval=0.2, health_check_interval_secs=0.2, health_success_threshold=1,
    health_failure_threshold=2, drain_settle_secs=0.0,
)  # fmt: skip


@pytest.fixture
async def engine() -> AsyncIterator[GrpcEngineServer]:
    server = GrpcEngineServer(GrpcEngineConfig(runtime="sglang", tokenizer=MISTRAL, model=MODEL))
    await server.start()
    yield server
    await server.stop(None)


@pytest.fixture
async def fleet(make_gateway: GatewayFactory) -> AsyncIterator[tuple[httpx.AsyncClient, RegistrySync]]:
    gateway = make_gateway([], **FAST)
    running = RegistrySync(current_config())
    await running.astart()
    yield gateway, running
    await running.astop()


async def routed_as_ready(worker_id: str) -> bool:
    return any(h.id == worker_id and h.record.status == "ready" for h in REGISTRY.snapshot.workers)


async def test_readiness_waits_for_the_tokenizer_then_the_first_request_is_served(
    fleet: tuple[httpx.AsyncClient, RegistrySync], engine: GrpcEngineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, _ = fleet
    TOKENIZERS.clear()  # none loaded by an earlier test
    gate = Gate(monkeypatch, tokenizer_registry)  # the load waits at its fetch until opened
    response = await gateway.post("/workers", json={"url": engine.url})
    assert response.status_code == 202, response.text
    worker_id = response.json()["worker_id"]
    await until(lambda: routed_as_ready(worker_id))

    # The fleet loop started the load when the worker became ready, before any request or probe.
    assert TOKENIZERS.cache.loading(MISTRAL)
    for _ in range(2):
        probe = await gateway.get("/readiness")
        assert probe.status_code == 503
        assert probe.json() == {
            "status": "not_ready", "workers": {"ready": 1, "total": 1}, "models_without_tokenizer": [MODEL],
        }  # fmt: skip
    assert engine.state.requests == []

    gate.open()
    await asyncio.wrap_future(TOKENIZERS.cache.start(MISTRAL))  # the load under way, to its end
    probe = await gateway.get("/readiness")
    assert probe.status_code == 200 and probe.json() == {"status": "ready", "workers": {"ready": 1, "total": 1}}
    chat = await gateway.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"]
    assert len(engine.state.requests) == 1


async def test_relayed_http_workers_need_no_tokenizer(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    TOKENIZERS.clear()
    probe = await make_gateway([record_for(worker)]).get("/readiness")
    assert probe.status_code == 200 and probe.json()["status"] == "ready"
    assert len(TOKENIZERS.cache) == 0 and not TOKENIZERS.cache.loading(worker.url)


async def test_the_resolver_is_ready_once_a_tokenizer_loaded_and_never_for_one_that_fails() -> None:
    resolver = TokenizerResolver(cache_size=1)
    assert not resolver.ready("m", location=MISTRAL)  # starts the load
    assert resolver.cache.loading(MISTRAL)
    await asyncio.wrap_future(resolver.cache.start(MISTRAL))
    assert resolver.ready("m", location=MISTRAL)
    # Dropped from a full cache (another template of it took the one place): a request reloads
    # it, so readiness does not flap with more tokenizers than the cache holds.
    await asyncio.wrap_future(resolver.cache.start(MISTRAL, "{{ messages }}"))
    assert resolver.cache.peek(MISTRAL) is None and resolver.ready("m", location=MISTRAL)

    assert not resolver.ready("bad", location="/no/such/dir")
    with pytest.raises(TokenizerLoadError):
        await asyncio.wrap_future(resolver.cache.start("/no/such/dir"))
    assert not resolver.ready("bad", location="/no/such/dir")  # 500 tokenizer_not_found meanwhile
    with pytest.raises(GatewayError) as failed:
        resolver.tokenizer_for("bad", location="/no/such/dir")
    assert failed.value.code == "tokenizer_not_found"


def test_without_autoload_a_model_no_tokenizer_covers_is_never_ready() -> None:
    install_config(GatewayConfig(disable_tokenizer_autoload=True), export=False)
    try:
        assert not TokenizerResolver().ready("unregistered-model", fallback="grpc://127.0.0.1:1")
    finally:
        install_config(GatewayConfig(), export=False)

"""vLLM gRPC PD workers registered through POST /workers (issue 24 item 2): the KV connector and
engine id the engine reports in GetServerInfo are stored as labels (shown by GET /workers as
kv_connector / kv_engine_id), and routing hands the KV over by that connector (NIXL: the prefill
tagged, its params relayed to the decode) with the gateway's real fleet loop."""

from __future__ import annotations

from typing import Any, AsyncIterator

import httpx
import pytest

from administration.registry_sync import RegistrySync
from common.config import current_config
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.registry import REGISTRY
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd_vllm import NIXL, VllmPdServer
from standins.pd_worker import PdWorkerConfig
from tests.conftest import GatewayFactory, until
from tests.inference.served.conftest import QWEN, QWEN_MODEL

pytestmark = pytest.mark.django_db(transaction=True)

FAST: dict[str, Any] = dict(
    worker_startup_check_interval=0.2, health_check_interval_secs=0.2, health_success_threshold=1,
    health_failure_threshold=2, drain_settle_secs=0.0, history_backend="memory", retry_max_retries=0,
)  # fmt: skip


@pytest.fixture
async def fleet(make_gateway: GatewayFactory) -> AsyncIterator[httpx.AsyncClient]:
    gateway = make_gateway([], **FAST)
    running = RegistrySync(current_config())
    await running.astart()
    yield gateway
    await running.astop()


async def test_the_engine_reported_connector_routes_the_kv_handoff(fleet: httpx.AsyncClient) -> None:
    config = GrpcEngineConfig(runtime="vllm", tokenizer=QWEN, model=QWEN_MODEL)
    prefill = VllmPdServer(config, PdWorkerConfig("prefill"), NIXL, engine_id="prefill-7")
    decode = VllmPdServer(config, PdWorkerConfig("decode"), NIXL, engine_id="decode-7")
    await prefill.start()
    await decode.start()
    try:
        TOKENIZERS.cache.get(QWEN, None)
        ids = []
        for server, role in ((prefill, "prefill"), (decode, "decode")):
            spec: dict[str, Any] = {"url": server.url, "worker_type": role}
            if server.bootstrap_port is not None:
                spec["bootstrap_port"] = server.bootstrap_port
            answer = await fleet.post("/workers", json=spec)
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["worker_id"])

        async def both_ready() -> bool:
            ready = {h.id for h in REGISTRY.snapshot.workers if h.record.status == "ready"}
            return set(ids) <= ready

        await until(both_ready)
        shown = (await fleet.get(f"/workers/{ids[0]}")).json()
        assert (shown["kv_connector"], shown["kv_engine_id"]) == (NIXL, "prefill-7")

        chat = await fleet.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200, chat.text
        assert prefill.pd.received[-1]["kv_transfer_params_json"] == {"do_remote_decode": True, "do_remote_prefill": False}
        assert decode.pd.received[-1]["kv_transfer_params_json"]["remote_engine_id"] == "prefill-7"
        assert decode.pd.kv_waits == 1 and decode.pd.kv_failures == 0
    finally:
        await prefill.stop()
        await decode.stop()

"""vLLM gRPC PD workers registered through POST /workers (issue 24 item 2): the KV connector and
engine id the engine reports in GetServerInfo are stored as labels (shown by GET /workers as
kv_connector / kv_engine_id), and routing hands the KV over by that connector (NIXL: the prefill
tagged, its params relayed to the decode) with the gateway's real fleet loop."""

from __future__ import annotations

from typing import Any, AsyncIterator

import httpx
import pytest

from common.db import arun_db
from administration.kv_engine_reread import reread_kv_engine_id, rereads_kv_engine_id
from administration.models import Worker
from administration.registry_sync import RegistrySync
from common.config import current_config
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.registry import REGISTRY
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd_vllm import MOONCAKE, NIXL, VllmPdServer
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


def _stored_labels(worker_id: str) -> dict[str, str]:
    return dict(Worker.objects.get(pk=worker_id).labels)


async def test_a_recovered_worker_re_reads_its_engine_id(fleet: httpx.AsyncClient) -> None:
    """Spec 3: a gRPC prefill or decode worker that recovers from not_ready re-reads kv_engine_id from
    its engine (the engine's value replaces the stored label); an operator's kv_engine_id field still
    wins where the id is used (D63)."""
    config = GrpcEngineConfig(runtime="vllm", tokenizer=QWEN, model=QWEN_MODEL)
    prefill = VllmPdServer(config, PdWorkerConfig("prefill"), MOONCAKE, engine_id="prefill-1")
    decode = VllmPdServer(config, PdWorkerConfig("decode"), MOONCAKE, engine_id="decode-1")
    await prefill.start()
    await decode.start()
    try:
        TOKENIZERS.cache.get(QWEN, None)
        prefill_spec: dict[str, Any] = {"url": prefill.url, "worker_type": "prefill", "bootstrap_port": prefill.bootstrap_port}
        decode_spec: dict[str, Any] = {"url": decode.url, "worker_type": "decode", "kv_engine_id": "pinned-decode"}
        ids = []
        for spec in (prefill_spec, decode_spec):
            answer = await fleet.post("/workers", json=spec)
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["worker_id"])
        prefill_id, decode_id = ids

        def status_of(worker_id: str) -> str | None:
            return next((h.record.status for h in REGISTRY.snapshot.workers if h.id == worker_id), None)

        async def both(status: str) -> bool:
            return all(status_of(worker_id) == status for worker_id in ids)

        async def labels_of(worker_id: str) -> dict[str, str]:
            return await arun_db(_stored_labels, worker_id)

        await until(lambda: both("ready"))
        assert (await fleet.get(f"/workers/{prefill_id}")).json()["kv_engine_id"] == "prefill-1"
        assert (await labels_of(decode_id))["kv_engine_id"] == "decode-1"

        # Both engines stop: the workers leave rotation; each comes back on its port with a new engine id.
        for server in (prefill, decode):
            await server.stop()
        await until(lambda: both("not_ready"))
        assert (await labels_of(prefill_id))["kv_engine_id"] == "prefill-1"  # nothing re-read while down
        for server, engine_id in ((prefill, "prefill-2"), (decode, "decode-2")):
            server.engine_id = engine_id
            await server.start(port=server.port)
        await until(lambda: both("ready"))

        async def re_read() -> bool:
            return ((await labels_of(prefill_id)).get("kv_engine_id"), (await labels_of(decode_id)).get("kv_engine_id")) == (
                "prefill-2", "decode-2",
            )  # fmt: skip

        await until(re_read)
        assert (await labels_of(prefill_id))["kv_connector"] == MOONCAKE
        assert (await fleet.get(f"/workers/{prefill_id}")).json()["kv_engine_id"] == "prefill-2"
        # The operator's field overrides the engine-reported id: it is what GET /workers shows.
        assert (await fleet.get(f"/workers/{decode_id}")).json()["kv_engine_id"] == "pinned-decode"
    finally:
        await prefill.stop()
        await decode.stop()


async def test_a_failed_re_read_changes_nothing(fleet: httpx.AsyncClient) -> None:
    """The re-read is the control plane's: an engine that does not answer GetServerInfo leaves the
    stored id as it was, and the call never raises into the health loop."""
    config = GrpcEngineConfig(runtime="vllm", tokenizer=QWEN, model=QWEN_MODEL)
    decode = VllmPdServer(config, PdWorkerConfig("decode"), MOONCAKE, engine_id="decode-1")
    await decode.start()
    try:
        TOKENIZERS.cache.get(QWEN, None)
        answer = await fleet.post("/workers", json={"url": decode.url, "worker_type": "decode"})
        assert answer.status_code == 202, answer.text
        worker_id = answer.json()["worker_id"]

        async def ready() -> bool:
            return any(h.id == worker_id and h.record.status == "ready" for h in REGISTRY.snapshot.workers)

        await until(ready)
        record = next(h.record for h in REGISTRY.snapshot.workers if h.id == worker_id)
        assert rereads_kv_engine_id(record, "decode", "not_ready", "ready")
        assert not rereads_kv_engine_id(record, "regular", "not_ready", "ready")
        assert not rereads_kv_engine_id(record, "decode", "pending", "ready")
        assert await reread_kv_engine_id(worker_id, record, 5.0) is None  # the same id: nothing to store
        await decode.stop()
        assert await reread_kv_engine_id(worker_id, record, 1.0) is None
        assert (await arun_db(_stored_labels, worker_id))["kv_engine_id"] == "decode-1"
    finally:
        await decode.stop()

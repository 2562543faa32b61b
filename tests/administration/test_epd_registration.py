"""gRPC EPD workers registered through POST /workers with the gateway's real fleet loop: a TokenSpeed
encode worker stand-in (worker_type encode, its bootstrap_port) is detected, health-checked to ready
and listed like the rest (GET /workers counts it in the total only), and an image request then runs
through it and the registered prefill/decode pair."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from administration.registry_sync import RegistrySync
from common.config import current_config
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.registry import REGISTRY
from standins.grpc_encoder import GrpcEncoderServer, GrpcTokenSpeedPdServer
from standins.grpc_engine import GrpcEngineConfig
from standins.pd_worker import PdWorkerConfig
from tests.conftest import GatewayFactory, until
from tests.inference.served.conftest import QWEN_MODEL
from tests.inference.served.test_epd_served import PNG, VISION_TEMPLATE, data_url, vision_model

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


async def test_registered_encode_worker_is_listed_and_encodes_images(fleet: httpx.AsyncClient, tmp_path: Path) -> None:
    template = tmp_path / "vision.jinja"
    template.write_text(VISION_TEMPLATE)
    model = vision_model(tmp_path)
    engine = GrpcEngineConfig(runtime="tokenspeed", tokenizer=model, model=QWEN_MODEL)
    encoder = GrpcEncoderServer(engine)
    prefill = GrpcTokenSpeedPdServer(engine, PdWorkerConfig("prefill"))
    decode = GrpcTokenSpeedPdServer(engine, PdWorkerConfig("decode"))
    for server in (encoder, prefill, decode):
        await server.start()
    try:
        ids = []
        for server, role, port in ((encoder, "encode", encoder.bootstrap_port), (prefill, "prefill", prefill.bootstrap_port),
                                   (decode, "decode", None)):  # fmt: skip
            card = {"id": QWEN_MODEL, "tokenizer_path": model, "chat_template": str(template)}
            spec: dict[str, Any] = {"url": server.url, "worker_type": role, "models": [card]}
            if port is not None:
                spec["bootstrap_port"] = port
            answer = await fleet.post("/workers", json=spec)
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["worker_id"])

        async def ready() -> bool:
            return set(ids) <= {h.id for h in REGISTRY.snapshot.workers if h.record.status == "ready"}

        await until(ready)
        listing = (await fleet.get("/workers")).json()
        assert listing["total"] == 3 and listing["stats"] == {"prefill_count": 1, "decode_count": 1, "regular_count": 0}
        shown = (await fleet.get(f"/workers/{ids[0]}")).json()
        assert (shown["worker_type"], shown["runtime_type"], shown["bootstrap_port"]) == ("encode", "tokenspeed", encoder.bootstrap_port)

        TOKENIZERS.cache.get(model, str(template))
        parts = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": data_url(PNG)}}]
        chat = await fleet.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": parts}]})
        assert chat.status_code == 200, chat.text
        assert len(encoder.received) == 1 and encoder.invalid == 0
        assert prefill.service.encode_received[-1][0]["bootstrap_port"] == encoder.bootstrap_port
        assert encoder.received[0]["shapes"] == [[16, 1176]]  # the image's patches (Qwen2-VL's processor)
    finally:
        for server in (encoder, prefill, decode):
            await server.stop()

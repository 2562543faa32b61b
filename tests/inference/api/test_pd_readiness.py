"""/readiness with prefill/decode workers (issue 24 item 2): a deployment of only prefill and
decode workers is ready once a pair can serve (the reference answers 200 too), not with one side
alone; for a gRPC pair, not before the tokenizers of its engine workers are loaded, as for a
regular gRPC worker."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from inference.pipeline import tokenizer_registry
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.workers import PdTraits, WorkerType
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd import GrpcPdServer
from standins.pd_worker import PdWorkerConfig
from tests.administration.test_tokenizer_registry import Gate
from tests.conftest import GatewayFactory
from tests.inference.served.conftest import QWEN, QWEN_MODEL
from tests.inference.served.test_pd_served import pd_record
from tests.pd_fleet import serving_pd_worker

pytestmark = pytest.mark.django_db(transaction=True)


async def test_an_http_pd_pair_is_ready_and_one_side_alone_is_not(make_gateway: GatewayFactory) -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        probe = await make_gateway([prefill.record(), decode.record()]).get("/readiness")
        assert probe.status_code == 200
        assert probe.json() == {"status": "ready", "workers": {"ready": 2, "total": 2}}

        alone = await make_gateway([prefill.record()]).get("/readiness")
        assert alone.status_code == 503 and alone.json()["status"] == "not_ready"

        # Sides that never pair (different pairing_protocol labels) serve nothing either.
        apart = await make_gateway([prefill.record(pairing_protocol="a"), decode.record(pairing_protocol="b")]).get("/readiness")
        assert apart.status_code == 503 and apart.json()["status"] == "not_ready"


async def test_a_grpc_pd_pair_is_ready_once_its_tokenizers_are_loaded(
    make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("decode"))
    await prefill.start()
    await decode.start()
    try:
        TOKENIZERS.clear()
        gate = Gate(monkeypatch, tokenizer_registry)  # the load waits at its fetch until opened
        records = [pd_record(prefill, WorkerType.PREFILL), pd_record(decode, WorkerType.DECODE)]
        gateway = make_gateway(records)
        probe = await gateway.get("/readiness")
        assert probe.status_code == 503
        assert probe.json() == {
            "status": "not_ready", "workers": {"ready": 2, "total": 2}, "models_without_tokenizer": [QWEN_MODEL],
        }  # fmt: skip
        assert TOKENIZERS.cache.loading(QWEN)  # the probe started the load

        gate.open()
        await asyncio.wrap_future(TOKENIZERS.cache.start(QWEN))
        probe = await gateway.get("/readiness")
        assert probe.status_code == 200 and probe.json()["status"] == "ready"
        chat = await gateway.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200, chat.text
        assert len(decode.pd.received) == len(prefill.pd.received) == 1

        # A decode worker that pairs with no prefill (other pairing label) leaves the model unserved.
        lone = dataclasses.replace(records[1], pd=PdTraits(pairing_protocol="elsewhere"))
        assert (await make_gateway([records[0], lone]).get("/readiness")).status_code == 503
    finally:
        await prefill.stop()
        await decode.stop()

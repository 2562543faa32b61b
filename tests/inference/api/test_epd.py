"""gRPC EPD deployments (issue 24 item 2; spec 2: "gRPC EPD 501"): a model whose only workers are
an engine encode worker and a gRPC prefill/decode pair answers /v1/responses with 501
endpoint_not_supported before anything reaches an engine (whole and streamed); chat on the same deployment is served by the pair; a regular worker for the
model, or an HTTP encode worker, is no EPD deployment."""

from __future__ import annotations

import uuid

import pytest

from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.workers import EngineSpec, WorkerRecord, WorkerStatus, WorkerType
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd import GrpcPdServer
from standins.pd_worker import PdWorkerConfig
from tests.conftest import GatewayFactory
from tests.inference.served.conftest import QWEN, QWEN_MODEL
from tests.inference.served.test_pd_served import pd_record

pytestmark = pytest.mark.django_db(transaction=True)


def encoder(url: str = "grpc://127.0.0.1:1", model: str | None = QWEN_MODEL) -> WorkerRecord:
    return WorkerRecord(
        id=str(uuid.uuid4()), url=url, model_id=model, runtime_type="sglang", status=WorkerStatus.READY,
        worker_type=WorkerType.ENCODE, engine=EngineSpec() if url.startswith("grpc") else None,
    )  # fmt: skip


async def test_responses_on_a_grpc_epd_deployment_is_501_and_chat_is_served_by_the_pair(make_gateway: GatewayFactory) -> None:
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("decode"))
    await prefill.start()
    await decode.start()
    try:
        TOKENIZERS.cache.get(QWEN, None)
        records = [encoder(), pd_record(prefill, WorkerType.PREFILL), pd_record(decode, WorkerType.DECODE)]
        http = make_gateway(records, history_backend="memory", retry_max_retries=0)
        for body in ({"model": QWEN_MODEL, "input": "hi"}, {"model": QWEN_MODEL, "input": "hi", "stream": True}):
            answer = await http.post("/v1/responses", json=body)
            assert answer.status_code == 501, answer.text
            assert answer.json()["error"]["code"] == "endpoint_not_supported"
        assert not prefill.pd.received and not decode.pd.received

        chat = await http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200, chat.text
        assert len(decode.pd.received) == 1
    finally:
        await prefill.stop()
        await decode.stop()


async def test_an_encode_worker_beside_a_regular_one_or_over_http_is_no_epd_deployment(make_gateway: GatewayFactory) -> None:
    # Only an HTTP encode worker: no gRPC EPD, nothing to serve the model: 503, not 501.
    http = make_gateway([encoder("http://127.0.0.1:1")], history_backend="memory")
    answer = await http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi"})
    assert answer.status_code == 503
    # An encode worker serving another model leaves this one's answer alone.
    http = make_gateway([encoder(model="other-model")], history_backend="memory")
    answer = await http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi"})
    assert answer.status_code in (404, 503) and answer.json()["error"]["code"] != "endpoint_not_supported"

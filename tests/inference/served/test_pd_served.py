"""gRPC PD through the gateway's served pipeline: chat (whole and streamed) and completions on a
SGLang prefill/decode pair of gRPC stand-ins, read with the openai SDK in strict mode; both engines
got the same DisaggregatedParams; a prefill that fails ends the request and cancels the decode; a
runtime without the rendezvous is refused with the reference's 400."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from typing import AsyncIterator

import httpx
import openai
import pytest

from inference.pipeline.parsers import choose_parsers
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.registry import REGISTRY
from inference.routing.workers import EngineSpec, PdTraits, WorkerRecord, WorkerStatus, WorkerType
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd import GrpcPdServer
from standins.pd_worker import PdWorkerConfig
from tests.conftest import GatewayFactory, until
from tests.inference.served.conftest import QWEN, QWEN_MODEL


def pd_record(server: GrpcPdServer, kind: WorkerType, runtime: str = "sglang") -> WorkerRecord:
    family = choose_parsers(QWEN_MODEL)
    return WorkerRecord(
        id=str(uuid.uuid4()), url=server.url, model_id=QWEN_MODEL, runtime_type=runtime, status=WorkerStatus.READY,
        worker_type=kind, engine=EngineSpec(tokenizer=QWEN, tool_parser=family.tool_parser, reasoning_parser=family.reasoning_parser),
        pd=PdTraits(bootstrap_port=server.bootstrap_port),
    )


@contextlib.asynccontextmanager
async def pd_engines(make_gateway: GatewayFactory, runtime: str = "sglang") -> AsyncIterator[tuple[httpx.AsyncClient, GrpcPdServer, GrpcPdServer]]:
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("decode"))
    await prefill.start()
    await decode.start()
    try:
        records = [pd_record(prefill, WorkerType.PREFILL, runtime), pd_record(decode, WorkerType.DECODE, runtime)]
        TOKENIZERS.cache.get(QWEN, None)
        yield make_gateway(records, history_backend="memory", retry_max_retries=0), prefill, decode
    finally:
        await prefill.stop()
        await decode.stop()


def sdk(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="x", http_client=http,
                              _strict_response_validation=True, max_retries=0)  # fmt: skip


async def test_chat_and_completions_through_grpc_pd(make_gateway: GatewayFactory) -> None:
    async with pd_engines(make_gateway) as (http, prefill, decode):
        answer = await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi"}])
        assert answer.choices[0].message.content is not None
        assert prefill.pd.received[-1] == decode.pd.received[-1]
        seen = decode.pd.received[-1]
        assert (seen["bootstrap_host"], seen["bootstrap_port"]) == ("127.0.0.1", prefill.bootstrap_port)
        assert 0 <= seen["bootstrap_room"] < 2**31 - 1

        stream = await sdk(http).chat.completions.create(
            model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].choices[0].finish_reason is not None
        assert len(decode.pd.received) == 2 and len(prefill.pd.received) == 2

        completion = await sdk(http).completions.create(model=QWEN_MODEL, prompt="Hello", max_tokens=8)
        assert completion.choices[0].text is not None
        assert decode.pd.kv_failures == 0


async def test_a_failing_prefill_ends_a_grpc_pd_request_and_cancels_the_decode(make_gateway: GatewayFactory) -> None:
    async with pd_engines(make_gateway) as (http, prefill, decode):
        prompt = "Hi [[pd:prefill_fail]] [[pd:decode_hang]]"
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=[{"role": "user", "content": prompt}])
        assert caught.value.status_code == 502

        async def decode_cancelled() -> bool:
            return decode.pd.cancelled == 1

        await until(decode_cancelled)
        snapshot = REGISTRY.snapshot
        loads = {handle.record.worker_type: handle.load for handle in snapshot.workers}
        assert loads[WorkerType.PREFILL].breaker.failures == 1  # counted on the prefill worker, not its decode
        assert loads[WorkerType.DECODE].breaker.failures == 0
        assert loads[WorkerType.PREFILL].in_flight == loads[WorkerType.DECODE].in_flight == 0


async def test_a_runtime_without_the_rendezvous_is_refused(make_gateway: GatewayFactory) -> None:
    async with pd_engines(make_gateway, runtime="trtllm") as (http, prefill, decode):
        answer = await http.post("/v1/chat/completions", json={"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hi"}]})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "runtime_pd_not_supported"
        assert dataclasses.is_dataclass(prefill.pd) and not decode.pd.received


async def test_a_prompt_must_fit_the_smaller_context_window_of_the_pair(make_gateway: GatewayFactory) -> None:
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("decode"))
    await prefill.start()
    await decode.start()
    try:
        small = pd_record(prefill, WorkerType.PREFILL)
        small = dataclasses.replace(small, engine=dataclasses.replace(small.engine or EngineSpec(), context_length=8))
        http = make_gateway([small, pd_record(decode, WorkerType.DECODE)], history_backend="memory", retry_max_retries=0)
        answer = await http.post("/v1/chat/completions", json={
            "model": QWEN_MODEL, "messages": [{"role": "user", "content": "a prompt longer than eight tokens, surely"}],
        })
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
        assert not decode.pd.received and not prefill.pd.received
    finally:
        await prefill.stop()
        await decode.stop()


async def test_a_decode_that_never_gets_its_kv_counts_a_kv_transfer_failure(make_gateway: GatewayFactory) -> None:
    from common.telemetry import REGISTRY

    before = REGISTRY.get_sample_value("gw_pd_kv_transfer_failures_total") or 0.0
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(
        GrpcEngineConfig(runtime="sglang", tokenizer=QWEN, model=QWEN_MODEL), PdWorkerConfig("decode", kv_timeout_s=0.3)
    )
    await prefill.start()
    await decode.start()
    try:
        TOKENIZERS.cache.get(QWEN, None)
        http = make_gateway([pd_record(prefill, WorkerType.PREFILL), pd_record(decode, WorkerType.DECODE)],
                            history_backend="memory", retry_max_retries=0)  # fmt: skip
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(http).chat.completions.create(
                model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi [[pd:prefill_hang]]"}]
            )
        assert caught.value.status_code == 502 and decode.pd.kv_failures == 1
    finally:
        await prefill.stop()
        await decode.stop()
    assert (REGISTRY.get_sample_value("gw_pd_kv_transfer_failures_total") or 0.0) == before + 1


def pd_failures() -> tuple[float, float]:
    from common.telemetry import REGISTRY

    return (
        REGISTRY.get_sample_value("gw_pd_bootstrap_failures_total") or 0.0,
        REGISTRY.get_sample_value("gw_pd_kv_transfer_failures_total") or 0.0,
    )


@pytest.mark.parametrize(
    ("markers", "counted"),
    [
        ("[[pd:prefill_bootstrap_fail]] [[pd:decode_hang]]", (1, 0)),  # "Prefill bootstrap failed ..."
        ("[[pd:prefill_transfer_fail]] [[pd:decode_hang]]", (0, 1)),  # "Prefill transfer failed ..."
        ("[[pd:decode_bootstrap_fail]]", (1, 0)),  # "Decode handshake failed ..."
        ("[[pd:decode_transfer_fail]]", (0, 1)),  # "Decode transfer failed ..."
        ("[[pd:decode_fail]]", (0, 0)),  # an engine failure that reports neither
        ("[[pd:prefill_fail]] [[pd:decode_hang]]", (0, 0)),
    ],
)
async def test_what_an_sglang_engine_reports_is_what_is_counted(
    make_gateway: GatewayFactory, markers: str, counted: tuple[int, int]
) -> None:
    async with pd_engines(make_gateway) as (http, prefill, decode):
        before = pd_failures()
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=[{"role": "user", "content": f"Hi {markers}"}])
        assert caught.value.status_code == 502
        after = pd_failures()
        assert (after[0] - before[0], after[1] - before[1]) == counted

"""The SGLang gRPC stand-in in a PD role: disaggregated_params required, prefill and decode meeting
by bootstrap_room, faults on command and cancellation seen."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

import grpc
import pytest

from protos import sglang_scheduler_pb2 as sg
from protos import sglang_scheduler_pb2_grpc as sg_rpc
from standins.fixtures import FIXTURE_MODELS
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd import GrpcPdServer
from standins.pd_worker import PdWorkerConfig
from tests.conftest import until

QWEN = str(FIXTURE_MODELS / "qwen3")


@contextlib.asynccontextmanager
async def pd_servers(kv_timeout_s: float = 30.0) -> AsyncIterator[tuple[GrpcPdServer, GrpcPdServer]]:
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN), PdWorkerConfig("decode", kv_timeout_s=kv_timeout_s))
    await prefill.start()
    await decode.start()
    try:
        yield prefill, decode
    finally:
        await prefill.stop()
        await decode.stop()


def request(server: GrpcPdServer, prefill: GrpcPdServer, room: int, text: str = "Hi", params: bool = True) -> sg.GenerateRequest:
    prompt = server.engine.model.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    message = sg.GenerateRequest(
        request_id=f"r{room}", tokenized=sg.TokenizedInput(input_ids=prompt, original_text=text),
        sampling_params=sg.SamplingParams(temperature=1.0, top_p=1.0, top_k=-1), stream=True,
    )
    if params:
        assert prefill.bootstrap_port is not None
        message.disaggregated_params.CopyFrom(
            sg.DisaggregatedParams(bootstrap_host="127.0.0.1", bootstrap_port=prefill.bootstrap_port, bootstrap_room=room)
        )
    return message


async def generate(server: GrpcPdServer, message: sg.GenerateRequest) -> list[sg.GenerateResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        return [r async for r in sg_rpc.SglangSchedulerStub(channel).Generate(message)]


async def test_generate_without_disaggregated_params_is_invalid_argument() -> None:
    async with pd_servers() as (prefill, decode):
        for server in (prefill, decode):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await generate(server, request(server, prefill, 1, params=False))
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_decode_generates_once_its_prefill_made_the_room_ready() -> None:
    async with pd_servers() as (prefill, decode):
        p, d = await asyncio.gather(generate(prefill, request(prefill, prefill, 12)), generate(decode, request(decode, prefill, 12)))
        assert d[-1].WhichOneof("response") == "complete"
        assert decode.pd.received[0] == {
            "path": "Generate", "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": 12,
        }
        assert prefill.pd.ready == 1 and decode.pd.kv_failures == 0


async def test_a_failed_prefill_fails_its_decode() -> None:
    async with pd_servers() as (prefill, decode):
        text = "Hi [[pd:prefill_fail]]"
        results = await asyncio.gather(
            generate(prefill, request(prefill, prefill, 3, text)), generate(decode, request(decode, prefill, 3, text)),
            return_exceptions=True,
        )
        assert all(isinstance(r, grpc.aio.AioRpcError) and r.code() is grpc.StatusCode.INTERNAL for r in results)
        assert "KV transfer failed for bootstrap_room 3" in str(results[1])


async def test_a_cancelled_hanging_prefill_is_counted() -> None:
    async with pd_servers() as (prefill, decode):
        call = asyncio.create_task(generate(prefill, request(prefill, prefill, 4, "Hi [[pd:prefill_hang]]")))

        async def arrived() -> bool:
            return len(prefill.pd.received) == 1

        await until(arrived)
        call.cancel()

        async def cancelled() -> bool:
            return prefill.pd.cancelled == 1

        await until(cancelled)

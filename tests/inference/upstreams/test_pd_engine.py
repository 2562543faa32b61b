"""gRPC PD (SGLang-style parallel dispatch) with the real SGLang client against the gRPC PD
stand-ins: both engines get the same DisaggregatedParams, the answer is the decode engine's, and a
failure on either side ends the request at once with the other side cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import AsyncIterator

import pytest

from inference.routing.pd import GRPC_DEFAULT_BOOTSTRAP_PORT, MAX_GRPC_ROOM, PdMember, PdTraits
from inference.routing.workers import WorkerHandle, WorkerLoad, WorkerRecord, WorkerStatus, WorkerType
from inference.upstreams.engine import EngineRequest, SamplingParams
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.grpc import SglangClient
from inference.upstreams.pd_engine import disaggregation_for, parallel_pd, pd_engine_refusal
from standins.fixtures import FIXTURE_MODELS
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd import GrpcPdServer
from standins.pd_worker import PdWorkerConfig
from tests.conftest import until

QWEN = str(FIXTURE_MODELS / "qwen3")


def member(server: GrpcPdServer, kind: WorkerType) -> PdMember:
    record = WorkerRecord(id=str(uuid.uuid4()), url=server.url, model_id="m", runtime_type="sglang",
                          status=WorkerStatus.READY, worker_type=kind)
    return PdMember.of(WorkerHandle(record, WorkerLoad()), PdTraits(bootstrap_port=server.bootstrap_port))


@contextlib.asynccontextmanager
async def engines(kv_timeout_s: float = 30.0) -> AsyncIterator[tuple[GrpcPdServer, GrpcPdServer, SglangClient, SglangClient]]:
    prefill = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN), PdWorkerConfig("prefill"))
    decode = GrpcPdServer(GrpcEngineConfig(runtime="sglang", tokenizer=QWEN), PdWorkerConfig("decode", kv_timeout_s=kv_timeout_s))
    await prefill.start()
    await decode.start()
    clients = SglangClient(prefill.url), SglangClient(decode.url)
    try:
        yield prefill, decode, *clients
    finally:
        for client in clients:
            await client.close()
        await prefill.stop()
        await decode.stop()


async def drain(outputs: AsyncIterator[object]) -> None:
    async for _ in outputs:
        pass


def engine_request(server: GrpcPdServer, text: str = "Hi") -> EngineRequest:
    prompt = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return EngineRequest(
        request_id=f"req-{uuid.uuid4().hex[:8]}", input_ids=tuple(server.engine.model.encode(prompt)),
        sampling=SamplingParams(max_new_tokens=8), original_text=text,
    )


async def test_both_engines_get_the_same_rendezvous_and_the_answer_is_the_decodes() -> None:
    async with engines() as (prefill, decode, prefill_client, decode_client):
        params = disaggregation_for(member(prefill, WorkerType.PREFILL))
        outputs = [o async for o in parallel_pd(prefill_client, decode_client, engine_request(decode), params)]
        assert outputs[-1].finished and sum(len(o.token_ids) for o in outputs) > 0
        assert prefill.pd.received[0] == decode.pd.received[0] == {
            "path": "Generate", "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": params.bootstrap_room,
        }
        assert 0 <= params.bootstrap_room <= MAX_GRPC_ROOM
        assert decode.pd.kv_failures == 0


def test_an_unset_bootstrap_port_is_8998_on_grpc() -> None:
    record = WorkerRecord(id="p", url="grpc://prefill-host:30000", model_id="m", runtime_type="sglang",
                          status=WorkerStatus.READY, worker_type=WorkerType.PREFILL)
    params = disaggregation_for(PdMember.of(WorkerHandle(record, WorkerLoad()), PdTraits()))
    assert (params.bootstrap_host, params.bootstrap_port) == ("prefill-host", GRPC_DEFAULT_BOOTSTRAP_PORT)


async def test_a_failing_prefill_ends_the_request_and_cancels_the_decode() -> None:
    async with engines() as (prefill, decode, prefill_client, decode_client):
        params = disaggregation_for(member(prefill, WorkerType.PREFILL))
        request = engine_request(decode, "Hi [[pd:prefill_fail]] [[pd:decode_hang]]")
        # The prefill fails once the decode engine has the request (on a loaded machine it could fail
        # before the decode's call arrived, and then there is nothing on the decode side to cancel).
        prefill.pd.failure_gate = asyncio.Event()
        run = asyncio.ensure_future(drain(parallel_pd(prefill_client, decode_client, request, params)))

        async def decode_running() -> bool:
            return len(decode.pd.received) == 1

        await until(decode_running)
        prefill.pd.failure_gate.set()
        with pytest.raises(UpstreamFailure):
            await run

        async def decode_cancelled() -> bool:
            return decode.pd.cancelled == 1

        await until(decode_cancelled)


async def test_a_failing_decode_ends_the_request_and_cancels_a_hanging_prefill() -> None:
    async with engines() as (prefill, decode, prefill_client, decode_client):
        params = disaggregation_for(member(prefill, WorkerType.PREFILL))
        request = engine_request(decode, "Hi [[pd:prefill_hang]] [[pd:decode_fail]]")
        decode.pd.failure_gate = asyncio.Event()  # the decode fails once the prefill engine has the request
        run = asyncio.ensure_future(drain(parallel_pd(prefill_client, decode_client, request, params)))

        async def prefill_running() -> bool:
            return len(prefill.pd.received) == 1

        await until(prefill_running)
        decode.pd.failure_gate.set()
        with pytest.raises(UpstreamFailure):
            await run

        async def prefill_cancelled() -> bool:
            return prefill.pd.cancelled == 1

        await until(prefill_cancelled)


async def test_a_hanging_prefill_ends_with_the_decodes_kv_failure() -> None:
    async with engines(kv_timeout_s=0.3) as (prefill, decode, prefill_client, decode_client):
        params = disaggregation_for(member(prefill, WorkerType.PREFILL))
        with pytest.raises(UpstreamFailure) as caught:
            async for _ in parallel_pd(prefill_client, decode_client, engine_request(decode, "Hi [[pd:prefill_hang]]"), params):
                pass
        assert "KV transfer failed" in caught.value.detail

        async def prefill_cancelled() -> bool:
            return prefill.pd.cancelled == 1

        await until(prefill_cancelled)


async def test_a_consumer_that_stops_early_cancels_both_sides() -> None:
    async with engines() as (prefill, decode, prefill_client, decode_client):
        params = disaggregation_for(member(prefill, WorkerType.PREFILL))
        outputs = parallel_pd(prefill_client, decode_client, engine_request(decode, "Hi [[pd:prefill_hang]]"), params)
        # The prefill hangs; the decode waits for its KV: the consumer gives up (a client disconnect).
        task = asyncio.ensure_future(anext(outputs))

        async def both_waiting() -> bool:
            return len(prefill.pd.received) == 1 and decode.pd.kv_waits == 1

        await until(both_waiting)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await outputs.aclose()  # type: ignore[attr-defined]

        async def both_cancelled() -> bool:
            return prefill.pd.cancelled == 1 and decode.pd.cancelled == 1

        await until(both_cancelled)


def test_runtimes_without_the_rendezvous_are_refused_as_the_reference_does() -> None:
    assert pd_engine_refusal("sglang") is None and pd_engine_refusal("tokenspeed") is None
    assert pd_engine_refusal("vllm") is None  # sequential PD with kv_transfer_params (issue 24 item 2)
    for runtime in ("trtllm", "mlx"):
        error = pd_engine_refusal(runtime)
        assert error is not None and (error.status, error.code) == (400, "runtime_pd_not_supported")

"""vLLM gRPC PD through the gateway's served pipeline (issue 24 item 2): sequential prefill then
decode, the KV handed over by kv_transfer_params as the prefill worker's connector wants it (NIXL:
tagged prefill, params relayed; Mooncake: a minted transfer id with the engine id known, else the
typed host and port), read with the openai SDK in strict mode; each failure side (prefill fails:
the decode never starts; the KV never comes: the decode's pull times out), and the gw_pd_* metrics
each records."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import openai
import pytest

from gateway_project.asgi import application
from inference.pipeline.parsers import choose_parsers
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.registry import REGISTRY
from inference.routing.workers import EngineSpec, PdTraits, WorkerRecord, WorkerStatus, WorkerType
from common.telemetry import REGISTRY as METRICS
from standins.grpc_engine import GrpcEngineConfig
from standins.grpc_pd_vllm import MOONCAKE, NIXL, VllmPdServer
from standins.pd_worker import PdWorkerConfig
from tests.conftest import GatewayFactory
from tests.inference.served.conftest import QWEN, QWEN_MODEL

LABELS = {"backend_type": "pd", "model": QWEN_MODEL, "runtime": "vllm"}


def record(server: VllmPdServer, kind: WorkerType, engine_id: str | None = None) -> WorkerRecord:
    family = choose_parsers(QWEN_MODEL)
    return WorkerRecord(
        id=str(uuid.uuid4()), url=server.url, model_id=QWEN_MODEL, runtime_type="vllm", status=WorkerStatus.READY,
        worker_type=kind, engine=EngineSpec(tokenizer=QWEN, tool_parser=family.tool_parser, reasoning_parser=family.reasoning_parser),
        pd=PdTraits(bootstrap_port=server.bootstrap_port, kv_connector=server.connector, kv_engine_id=engine_id),
    )


@contextlib.asynccontextmanager
async def vllm_pd(
    make_gateway: GatewayFactory, connector: str, engine_id: str | None = None, kv_timeout_s: float = 30.0,
    decode_delay_ms: float = 0.0,
) -> AsyncIterator[tuple[httpx.AsyncClient, VllmPdServer, VllmPdServer]]:
    config = GrpcEngineConfig(runtime="vllm", tokenizer=QWEN, model=QWEN_MODEL)
    prefill = VllmPdServer(config, PdWorkerConfig("prefill"), connector, engine_id or "engine-0")
    slow = GrpcEngineConfig(runtime="vllm", tokenizer=QWEN, model=QWEN_MODEL, delay_ms=decode_delay_ms, chunk_tokens=1)
    decode = VllmPdServer(slow if decode_delay_ms else config, PdWorkerConfig("decode", kv_timeout_s=kv_timeout_s), connector)
    await prefill.start()
    await decode.start()
    try:
        records = [record(prefill, WorkerType.PREFILL, engine_id), record(decode, WorkerType.DECODE)]
        TOKENIZERS.cache.get(QWEN, None)
        yield make_gateway(records, history_backend="memory", retry_max_retries=0), prefill, decode
    finally:
        await prefill.stop()
        await decode.stop()


def sdk(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="x", http_client=http,
                              _strict_response_validation=True, max_retries=0)  # fmt: skip


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return METRICS.get_sample_value(name, labels or {}) or 0.0


HI = [{"role": "user", "content": "Hi"}]


async def test_nixl_prefill_is_tagged_and_its_params_relayed_to_the_decode(make_gateway: GatewayFactory) -> None:
    modes = metric("gw_pd_kv_connector_mode_total", {"mode": "nixl"})
    transfers = metric("gw_pd_kv_transfer_duration_seconds_count", LABELS)
    async with vllm_pd(make_gateway, NIXL) as (http, prefill, decode):
        answer = await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=HI)
        assert answer.choices[0].message.content is not None
        first, then = prefill.pd.received[-1], decode.pd.received[-1]
        assert first["kv_transfer_params_json"] == {"do_remote_decode": True, "do_remote_prefill": False}
        assert (first["stream"], first["max_tokens"]) == (False, 1)
        sent = then["kv_transfer_params_json"]
        assert sent["do_remote_prefill"] is True and sent["remote_port"] == prefill.bootstrap_port
        assert then["request_id"] == first["request_id"]
        assert decode.pd.kv_waits == 1 and decode.pd.kv_failures == 0

        stream = await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=HI, stream=True)
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].choices[0].finish_reason is not None
        assert decode.pd.kv_waits == 2 and decode.pd.received[-1]["stream"] is True

        completion = await sdk(http).completions.create(model=QWEN_MODEL, prompt="Hello", max_tokens=8)
        assert completion.choices[0].text is not None
    assert metric("gw_pd_kv_connector_mode_total", {"mode": "nixl"}) == modes + 3
    assert metric("gw_pd_kv_transfer_duration_seconds_count", LABELS) == transfers + 3


async def test_with_n_above_one_nothing_is_relayed_and_the_decode_recomputes(make_gateway: GatewayFactory) -> None:
    failures = metric("gw_pd_kv_transfer_failures_total")
    async with vllm_pd(make_gateway, NIXL) as (http, prefill, decode):
        answer = await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=HI, n=2)
        assert len(answer.choices) == 2
        assert prefill.pd.received[-1]["kv_transfer_params_json"] is None
        assert decode.pd.received[-1]["kv_transfer_params_json"] is None and decode.pd.kv_waits == 0
    assert metric("gw_pd_kv_transfer_failures_total") == failures  # no handoff was expected


async def test_mooncake_with_the_engine_id_known_gets_a_minted_transfer_id(make_gateway: GatewayFactory) -> None:
    modes = metric("gw_pd_kv_connector_mode_total", {"mode": "mooncake"})
    async with vllm_pd(make_gateway, MOONCAKE, engine_id="prefill-engine") as (http, prefill, decode):
        answer = await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=HI)
        assert answer.choices[0].message.content is not None
        tagged = prefill.pd.received[-1]["kv_transfer_params_json"]
        assert tagged["do_remote_decode"] is True and tagged["transfer_id"].startswith("xfer-")
        given: dict[str, Any] = decode.pd.received[-1]["kv_transfer_params_json"]
        assert given == {
            "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": tagged["transfer_id"],
            "remote_engine_id": "prefill-engine", "remote_bootstrap_addr": f"http://127.0.0.1:{prefill.bootstrap_port}",
        }  # fmt: skip
        assert decode.pd.kv_waits == 1 and decode.pd.kv_failures == 0
    assert metric("gw_pd_kv_connector_mode_total", {"mode": "mooncake"}) == modes + 1


async def test_mooncake_without_the_engine_id_gets_the_typed_host_and_port(make_gateway: GatewayFactory) -> None:
    async with vllm_pd(make_gateway, MOONCAKE) as (http, prefill, decode):
        answer = await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=HI)
        assert answer.choices[0].message.content is not None
        assert prefill.pd.received[-1]["kv_transfer_params_json"] is None
        assert decode.pd.received[-1]["kv_transfer_params"] == ("127.0.0.1", prefill.bootstrap_port)
        assert decode.pd.kv_waits == 1 and decode.pd.kv_failures == 0


async def test_a_failing_prefill_ends_the_request_before_the_decode_starts(make_gateway: GatewayFactory) -> None:
    async with vllm_pd(make_gateway, NIXL) as (http, prefill, decode):
        prompt = [{"role": "user", "content": "Hi [[pd:prefill_fail]]"}]
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=prompt)
        assert caught.value.status_code == 502
        assert len(prefill.pd.received) == 1 and not decode.pd.received
        loads = {handle.record.worker_type: handle.load for handle in REGISTRY.snapshot.workers}
        assert loads[WorkerType.PREFILL].breaker.failures == 1  # the prefill worker's, not its decode's
        assert loads[WorkerType.DECODE].breaker.failures == 0
        assert loads[WorkerType.PREFILL].in_flight == loads[WorkerType.DECODE].in_flight == 0


async def test_a_kv_that_never_comes_fails_the_decode_and_counts(make_gateway: GatewayFactory) -> None:
    failures = metric("gw_pd_kv_transfer_failures_total")
    async with vllm_pd(make_gateway, NIXL, kv_timeout_s=0.3) as (http, prefill, decode):
        prompt = [{"role": "user", "content": "Hi [[pd:prefill_lose_kv]]"}]
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=prompt)
        assert caught.value.status_code == 502
        assert decode.pd.kv_failures == 1
    assert metric("gw_pd_kv_transfer_failures_total") == failures + 1



async def leaving_client(payload: dict[str, Any], leave: Callable[[], Awaitable[None]]) -> None:
    """POST /v1/chat/completions straight to the ASGI app by a client that goes away once ``leave``
    returns (httpx's ASGI transport cannot disconnect mid-request)."""
    body = httpx.Request("POST", "http://gateway", json=payload).content
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, object]:
        if messages:
            return messages.pop()
        await leave()
        return {"type": "http.disconnect"}

    async def send(_message: dict[str, object]) -> None:
        pass

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
    }  # fmt: skip
    await asyncio.wait_for(application(scope, receive, send), 10)  # type: ignore[arg-type]


async def eventually(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_a_client_leaving_during_the_prefill_aborts_the_prefill_and_never_starts_the_decode(
    make_gateway: GatewayFactory,
) -> None:
    async with vllm_pd(make_gateway, NIXL) as (http, prefill, decode):
        payload = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "Hi [[pd:prefill_hang]]"}]}

        async def prefill_started() -> None:
            await eventually(lambda: len(prefill.pd.received) == 1)

        await leaving_client(payload, prefill_started)
        request_id = prefill.pd.received[-1]["request_id"]
        await eventually(lambda: request_id in prefill.state.aborted_ids())  # gRPC Abort to the side in flight
        assert prefill.pd.cancelled == 1  # and its Generate RPC cancelled
        assert not decode.pd.received and not decode.state.aborts  # the decode leg never started
        assert all(handle.load.in_flight == 0 for handle in REGISTRY.snapshot.workers)


async def test_a_client_leaving_during_the_decode_aborts_the_decode(make_gateway: GatewayFactory) -> None:
    async with vllm_pd(make_gateway, NIXL, decode_delay_ms=50) as (http, prefill, decode):
        payload = {"model": QWEN_MODEL, "messages": HI, "stream": True, "max_tokens": 200}

        async def decoding() -> None:
            await eventually(lambda: bool(decode.state.requests))

        await leaving_client(payload, decoding)
        request_id = decode.pd.received[-1]["request_id"]
        await eventually(lambda: request_id in decode.state.aborted_ids())  # gRPC Abort to the side in flight
        assert decode.pd.cancelled == 1
        assert len(prefill.pd.received) == 1 and prefill.pd.cancelled == 0  # the prefill leg had ended
        assert all(handle.load.in_flight == 0 for handle in REGISTRY.snapshot.workers)


async def test_a_vllm_decode_whose_kv_load_fails_ends_with_error_and_counts(make_gateway: GatewayFactory) -> None:
    """vLLM (kv_load_failure_policy "fail") ends a request whose KV load failed with finish reason
    error: a KV transfer failure; a decode failing otherwise is not one."""
    async with vllm_pd(make_gateway, NIXL) as (http, prefill, decode):
        failures = metric("gw_pd_kv_transfer_failures_total")
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(http).chat.completions.create(
                model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi [[pd:decode_transfer_fail]]"}]
            )
        assert caught.value.status_code == 502 and decode.pd.kv_failures == 1
        assert metric("gw_pd_kv_transfer_failures_total") == failures + 1
        with pytest.raises(openai.APIStatusError):
            await sdk(http).chat.completions.create(model=QWEN_MODEL, messages=[{"role": "user", "content": "Hi [[pd:decode_fail]]"}])
        assert metric("gw_pd_kv_transfer_failures_total") == failures + 1

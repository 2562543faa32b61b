"""HTTP PD through the gateway: chat (whole and streamed), completions, generate, Responses and
Messages dual-dispatched to the prefill and decode stand-ins (the openai and anthropic SDKs read the
decode answer), the bootstrap fields the stand-ins received, 503 no_prefill_servers, pairing by
pairing_protocol, and each failure side ending the request with the other side cancelled."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import anthropic
import httpx
import httpx2
import openai
import pytest

from gateway_project.asgi import application
from tests.conftest import GatewayFactory, until
from tests.pd_fleet import PdWorker, serving_pd_worker

pytestmark = pytest.mark.django_db(transaction=True)


def sdk(gateway: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="x", http_client=gateway,
                              _strict_response_validation=True, max_retries=0)  # fmt: skip


@contextlib.asynccontextmanager
async def pd_gateway(make_gateway: GatewayFactory, kv_timeout_s: float = 30.0, **config: Any) -> AsyncIterator[tuple[httpx.AsyncClient, PdWorker, PdWorker]]:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode", kv_timeout_s=kv_timeout_s) as decode:
        yield make_gateway([prefill.record(), decode.record()], retry_max_retries=0, **config), prefill, decode


def met(prefill: PdWorker, decode: PdWorker) -> dict[str, Any]:
    """The one bootstrap both sides received for the last request (they must agree)."""
    assert prefill.pd.received[-1] == decode.pd.received[-1]
    return decode.pd.received[-1]


async def test_chat_through_pd_with_the_openai_sdk(make_gateway: GatewayFactory) -> None:
    async with pd_gateway(make_gateway) as (gateway, prefill, decode):
        answer = await sdk(gateway).chat.completions.create(model="mock-model", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content
        seen = met(prefill, decode)
        assert (seen["path"], seen["bootstrap_host"], seen["bootstrap_port"]) == (
            "/v1/chat/completions", "127.0.0.1", prefill.bootstrap_port,
        )
        assert 0 <= seen["bootstrap_room"] <= 2**63 - 1
        stream = await sdk(gateway).chat.completions.create(
            model="mock-model", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        assert text and decode.mock.streams_completed == 1
        assert met(prefill, decode)["bootstrap_room"] != seen["bootstrap_room"]


async def test_completions_generate_responses_and_messages_through_pd(make_gateway: GatewayFactory) -> None:
    async with pd_gateway(make_gateway) as (gateway, prefill, decode):
        completion = await sdk(gateway).completions.create(model="mock-model", prompt=["one", "two"], max_tokens=4)
        assert len(completion.choices) == 2
        assert len(met(prefill, decode)["bootstrap_room"]) == 2  # a batch: one room per prompt

        generated = await gateway.post("/generate", json={"model": "mock-model", "text": "hello"})
        assert generated.status_code == 200 and "text" in generated.json()
        assert met(prefill, decode)["path"] == "/generate"

        response = await sdk(gateway).responses.create(model="mock-model", input="hello", max_output_tokens=64)
        assert response.status == "completed"
        assert met(prefill, decode)["path"] == "/v1/responses"

        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=application), base_url="http://gateway", timeout=30)
        claude = anthropic.AsyncAnthropic(base_url="http://gateway", api_key="x", http_client=http, max_retries=0,
                                          _strict_response_validation=True)  # fmt: skip
        message = await claude.messages.create(model="mock-model", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].type == "text"
        assert met(prefill, decode)["path"] == "/v1/messages"


async def test_no_prefill_worker_is_503_no_prefill_servers(make_gateway: GatewayFactory) -> None:
    async with serving_pd_worker("decode") as decode:
        gateway = make_gateway([decode.record()], retry_max_retries=0)
        answer = await gateway.post("/v1/chat/completions", json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "no_prefill_servers"
        assert answer.json()["error"]["type"] == "service_unavailable"
        assert decode.pd.received == type(decode.pd.received)()


async def test_prefill_and_decode_pair_only_on_equal_pairing_protocol(make_gateway: GatewayFactory) -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        gateway = make_gateway([prefill.record(pairing_protocol="a"), decode.record(pairing_protocol="b")], retry_max_retries=0)
        answer = await gateway.post("/v1/chat/completions", json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "no_healthy_workers"


async def test_a_prefill_that_fails_ends_the_request_and_cancels_the_decode(make_gateway: GatewayFactory) -> None:
    async with pd_gateway(make_gateway) as (gateway, prefill, decode):
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                "mock": {"pd_fault": ["prefill_drop", "decode_hang"]}}
        answer = await gateway.post("/v1/chat/completions", json=body)
        assert answer.status_code == 502

        async def decode_cancelled() -> bool:
            return decode.pd.cancelled == 1 and decode.mock.in_flight == 0

        await until(decode_cancelled)


async def test_a_prefill_error_status_is_answered_with_the_prefill_code(make_gateway: GatewayFactory) -> None:
    async with pd_gateway(make_gateway) as (gateway, prefill, decode):
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                "mock": {"pd_fault": ["prefill_fail", "decode_hang"]}}
        answer = await gateway.post("/v1/chat/completions", json=body)
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "prefill_internal_error"

        async def decode_cancelled() -> bool:
            return decode.pd.cancelled == 1

        await until(decode_cancelled)


async def test_a_decode_that_fails_ends_the_request_and_cancels_the_prefill(make_gateway: GatewayFactory) -> None:
    async with pd_gateway(make_gateway) as (gateway, prefill, decode):
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "mock": {"pd_fault": ["prefill_hang", "decode_drop"]}}
        answer = await gateway.post("/v1/chat/completions", json=body)
        assert answer.status_code == 502

        async def prefill_cancelled() -> bool:
            return prefill.pd.cancelled == 1 and prefill.mock.in_flight == 0

        await until(prefill_cancelled)


async def test_a_hanging_prefill_ends_with_the_decodes_kv_failure(make_gateway: GatewayFactory) -> None:
    async with pd_gateway(make_gateway, kv_timeout_s=0.3) as (gateway, prefill, decode):
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"pd_fault": "prefill_hang"}}
        answer = await gateway.post("/v1/chat/completions", json=body)
        assert answer.status_code == 500 and "KV transfer failed" in answer.text

        async def prefill_cancelled() -> bool:
            return prefill.pd.cancelled == 1

        await until(prefill_cancelled)


async def test_a_failed_pair_is_retried_on_a_new_pair_without_the_worker_that_failed(make_gateway: GatewayFactory) -> None:
    async with serving_pd_worker("prefill", faults=("prefill_drop",)) as broken, serving_pd_worker("prefill") as prefill, \
            serving_pd_worker("decode") as decode:
        gateway = make_gateway([broken.record(), prefill.record(), decode.record()], retry_initial_backoff_ms=1)
        for _ in range(2):  # round robin would pick the broken prefill worker for one of them
            answer = await gateway.post("/v1/chat/completions", json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]})
            assert answer.status_code == 200
        assert len(broken.pd.received) >= 1 and len(prefill.pd.received) == 2
        assert decode.pd.kv_failures == 0


async def test_a_decode_without_its_kv_counts_a_kv_transfer_failure(make_gateway: GatewayFactory) -> None:
    from common.telemetry import REGISTRY

    before = REGISTRY.get_sample_value("gw_pd_kv_transfer_failures_total") or 0.0
    async with pd_gateway(make_gateway, kv_timeout_s=0.3) as (gateway, prefill, decode):
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"pd_fault": "prefill_hang"}}
        assert (await gateway.post("/v1/chat/completions", json=body)).status_code == 500
        assert decode.pd.kv_failures == 1
        # A decode that fails on its own with a status other than an internal error is not counted.
        refused = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"pd_fault": "decode_drop"}}
        await gateway.post("/v1/chat/completions", json=refused)
    assert (REGISTRY.get_sample_value("gw_pd_kv_transfer_failures_total") or 0.0) == before + 1


def pd_failures() -> tuple[float, float]:
    from common.telemetry import REGISTRY

    return (
        REGISTRY.get_sample_value("gw_pd_bootstrap_failures_total") or 0.0,
        REGISTRY.get_sample_value("gw_pd_kv_transfer_failures_total") or 0.0,
    )


@pytest.mark.parametrize(
    ("faults", "counted"),
    [
        (["prefill_bootstrap_fail", "decode_hang"], (1, 0)),  # SGLang: "Prefill bootstrap failed for request ..."
        (["prefill_transfer_fail", "decode_hang"], (0, 1)),  # "Prefill transfer failed for request ..."
        (["prefill_fail", "decode_hang"], (0, 0)),  # a prefill error that reports neither
    ],
)
async def test_what_a_prefill_answer_reports_is_what_is_counted(
    make_gateway: GatewayFactory, faults: list[str], counted: tuple[int, int]
) -> None:
    async with pd_gateway(make_gateway) as (gateway, prefill, decode):
        before = pd_failures()
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"pd_fault": faults}}
        answer = await gateway.post("/v1/chat/completions", json=body)
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "prefill_internal_error"
        after = pd_failures()
        assert (after[0] - before[0], after[1] - before[1]) == counted


async def test_a_prefill_without_a_bootstrap_host_sends_nothing_and_counts(make_gateway: GatewayFactory) -> None:
    """A prefill worker whose URL names no host: no bootstrap_host can be derived for its decode."""
    import dataclasses

    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        hostless = dataclasses.replace(prefill.record(), url=prefill.url.replace("127.0.0.1", ""))
        gateway = make_gateway([hostless, decode.record()], retry_max_retries=0)
        before = pd_failures()
        answer = await gateway.post("/v1/chat/completions", json={"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 500 and "bootstrap" in answer.json()["error"]["message"]
        assert not prefill.pd.received and not decode.pd.received
        assert pd_failures() == (before[0] + 1, before[1])


@pytest.mark.parametrize(
    ("fault", "reported", "counted"),
    [
        ("decode_bootstrap_fail", "Decode handshake failed for request", (1, 0)),  # SGLang's words
        ("decode_transfer_fail", "Decode transfer failed for request", (0, 1)),
        ("decode_fail", "decode failed on command", (0, 0)),  # a decode 500 that reports neither
    ],
)
async def test_what_a_decode_answer_reports_is_what_is_counted_and_relayed_as_it_came(
    make_gateway: GatewayFactory, fault: str, reported: str, counted: tuple[int, int]
) -> None:
    async with pd_gateway(make_gateway) as (gateway, prefill, decode):
        before = pd_failures()
        body = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}], "mock": {"pd_fault": fault}}
        answer = await gateway.post("/v1/chat/completions", json=body)
        assert answer.status_code == 500
        assert answer.json()["error"]["message"].startswith(reported)  # the decode's own answer
        after = pd_failures()
        assert (after[0] - before[0], after[1] - before[1]) == counted

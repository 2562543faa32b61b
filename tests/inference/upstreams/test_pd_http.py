"""HTTP PD dual dispatch against the prefill and decode stand-ins: the same bootstrap fields reach
both sides, the client gets the decode answer, and a failure on either side ends the request at
once with the other side cancelled (never left waiting for a bootstrap that does not come)."""

from __future__ import annotations

import contextlib
from collections.abc import MutableMapping
from typing import Any, AsyncIterator

import orjson
import pytest

from inference.auth import ANONYMOUS
from inference.errors import GatewayError
from inference.routing.pd import PdPair, inject_bootstrap, batch_size
from inference.upstreams.base import RelayRequest
from inference.upstreams.http import HttpRelay
from inference.upstreams.pd_http import PdFailure, PdHttpDispatch, _merged_event, _merged
from inference.writers import OPENAI_SSE, ResponseClock, ResponseWriter
from tests.conftest import until
from tests.pd_fleet import PdWorker, serving_pd_worker


class Sent(list):
    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        self.append(message)

    @property
    def status(self) -> int:
        return int(self[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self if m["type"] == "http.response.body")


@contextlib.asynccontextmanager
async def pd_pair(decode_kv_timeout: float = 30.0) -> AsyncIterator[tuple[PdWorker, PdWorker, PdPair, PdHttpDispatch]]:
    relay = HttpRelay(request_timeout_secs=60)
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode", kv_timeout_s=decode_kv_timeout) as decode:
        try:
            yield prefill, decode, PdPair(prefill.member(), decode.member()), PdHttpDispatch(relay)
        finally:
            await relay.close()


def requests(pair: PdPair, path: str, body: dict[str, Any]) -> tuple[RelayRequest, RelayRequest]:
    injected = orjson.dumps(inject_bootstrap(body, pair.prefill, batch_size(path, body)))
    stream = bool(body.get("stream"))

    def one(member: Any) -> RelayRequest:
        return RelayRequest(member.handle, path, injected, stream, b"rid-1", (), ANONYMOUS)

    return one(pair.prefill), one(pair.decode)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "mock-model", "messages": [{"role": "user", "content": "hello there"}], **extra}


async def forward(dispatch: PdHttpDispatch, pair: PdPair, path: str, body: dict[str, Any]) -> tuple[Sent, bool]:
    prefill_request, decode_request = requests(pair, path, body)
    answer = await dispatch.open(prefill_request, decode_request)
    sent = Sent()
    clean = (await answer.forward(ResponseWriter(sent, b"rid-1", ResponseClock(0.0), OPENAI_SSE))).clean
    return sent, clean


async def test_both_sides_get_the_prefill_bootstrap_and_the_client_the_decode_answer() -> None:
    async with pd_pair() as (prefill, decode, pair, dispatch):
        sent, clean = await forward(dispatch, pair, "/v1/chat/completions", chat())
        assert clean and sent.status == 200
        assert orjson.loads(sent.body)["object"] == "chat.completion"
        (seen_by_prefill,), (seen_by_decode,) = prefill.pd.received, decode.pd.received
        assert seen_by_prefill == seen_by_decode
        assert seen_by_decode["bootstrap_host"] == "127.0.0.1"
        assert seen_by_decode["bootstrap_port"] == prefill.bootstrap_port
        assert 0 <= seen_by_decode["bootstrap_room"] <= 2**63 - 1
        assert decode.pd.kv_failures == 0 and prefill.pd.cancelled == decode.pd.cancelled == 0


async def test_a_streamed_answer_comes_from_the_decode_worker() -> None:
    async with pd_pair() as (prefill, decode, pair, dispatch):
        sent, clean = await forward(dispatch, pair, "/v1/chat/completions", chat(stream=True))
        assert clean and sent.status == 200
        assert sent.body.endswith(b"data: [DONE]\n\n") and b"chat.completion.chunk" in sent.body
        assert decode.mock.streams_completed == 1


async def test_a_batch_gets_one_room_per_prompt() -> None:
    async with pd_pair() as (prefill, decode, pair, dispatch):
        body = {"model": "mock-model", "prompt": ["one", "two", "three"]}
        sent, _ = await forward(dispatch, pair, "/v1/completions", body)
        assert sent.status == 200
        seen = decode.pd.received[0]
        assert seen["bootstrap_host"] == ["127.0.0.1"] * 3
        assert seen["bootstrap_port"] == [prefill.bootstrap_port] * 3
        assert len(set(seen["bootstrap_room"])) == 3


async def test_a_prefill_without_a_bootstrap_port_sends_null() -> None:
    relay = HttpRelay(request_timeout_secs=60)
    async with serving_pd_worker("prefill", bootstrap=False) as prefill:
        body = inject_bootstrap(chat(), prefill.member())
        assert body["bootstrap_port"] is None and body["bootstrap_host"] == "127.0.0.1"
    await relay.close()


async def test_a_prefill_transport_failure_cancels_the_waiting_decode() -> None:
    async with pd_pair() as (prefill, decode, pair, dispatch):
        prefill_request, decode_request = requests(pair, "/v1/chat/completions", chat(mock={"pd_fault": "prefill_drop"}))
        with pytest.raises(PdFailure) as caught:
            await dispatch.open(prefill_request, decode_request)
        assert (caught.value.side, caught.value.worker_id) == ("prefill", pair.prefill.handle.id)
        assert caught.value.to_error().status == 502

        async def decode_cancelled() -> bool:
            return decode.pd.cancelled == 1 and decode.mock.in_flight == 0

        await until(decode_cancelled)
        assert decode.pd.kv_failures == 0  # it did not wait for its KV until it gave up


async def test_a_prefill_error_status_is_the_clients_answer_and_cancels_the_decode() -> None:
    async with pd_pair() as (prefill, decode, pair, dispatch):
        body = chat(mock={"pd_fault": ["prefill_fail", "decode_hang"]})
        prefill_request, decode_request = requests(pair, "/v1/chat/completions", body)
        with pytest.raises(GatewayError) as caught:
            await dispatch.open(prefill_request, decode_request)
        assert caught.value.status == 500 and caught.value.code == "prefill_internal_error"
        assert "Prefill server error (500)" in caught.value.message

        async def decode_cancelled() -> bool:
            return decode.pd.cancelled == 1 and decode.mock.in_flight == 0

        await until(decode_cancelled)


async def test_a_decode_transport_failure_cancels_a_hanging_prefill() -> None:
    async with pd_pair() as (prefill, decode, pair, dispatch):
        body = chat(mock={"pd_fault": ["prefill_hang", "decode_drop"]})
        prefill_request, decode_request = requests(pair, "/v1/chat/completions", body)
        with pytest.raises(PdFailure) as caught:
            await dispatch.open(prefill_request, decode_request)
        assert (caught.value.side, caught.value.worker_id) == ("decode", pair.decode.handle.id)

        async def prefill_cancelled() -> bool:
            return prefill.pd.cancelled == 1 and prefill.mock.in_flight == 0

        await until(prefill_cancelled)


async def test_a_hanging_prefill_ends_with_the_decode_error_and_is_cancelled() -> None:
    async with pd_pair(decode_kv_timeout=0.3) as (prefill, decode, pair, dispatch):
        sent, _ = await forward(dispatch, pair, "/v1/chat/completions", chat(mock={"pd_fault": "prefill_hang"}))
        assert sent.status == 500
        assert b"KV transfer failed" in sent.body

        async def prefill_cancelled() -> bool:
            return prefill.pd.cancelled == 1 and prefill.mock.in_flight == 0

        await until(prefill_cancelled)


async def test_a_decode_error_status_is_relayed() -> None:
    async with pd_pair() as (prefill, decode, pair, dispatch):
        sent, _ = await forward(dispatch, pair, "/v1/chat/completions", chat(mock={"pd_fault": "decode_fail"}))
        assert sent.status == 500 and b"decode failed on command" in sent.body

        async def settled() -> bool:
            return prefill.mock.in_flight == 0

        await until(settled)


async def test_a_hanging_prefill_during_a_decode_stream_is_cancelled_when_the_stream_ends() -> None:
    async with pd_pair(decode_kv_timeout=0.3) as (prefill, decode, pair, dispatch):
        sent, _ = await forward(dispatch, pair, "/v1/chat/completions", chat(stream=True, mock={"pd_fault": "prefill_hang"}))
        assert sent.status == 500  # the decode gave up on its KV before it answered

        async def prefill_cancelled() -> bool:
            return prefill.pd.cancelled == 1

        await until(prefill_cancelled)


def test_input_logprobs_of_the_prefill_go_in_front_of_the_decodes() -> None:
    answer: dict[str, Any] = {"text": "x", "meta_info": {"input_token_logprobs": [[-0.5, 3, None]]}}
    assert _merged(answer, [[-0.1, 1, None], [-0.2, 2, None]])
    assert answer["meta_info"]["input_token_logprobs"] == [[-0.1, 1, None], [-0.2, 2, None], [-0.5, 3, None]]
    assert not _merged({"text": "x", "meta_info": {}}, [[-0.1, 1, None]])
    event = b'data: {"meta_info":{"input_token_logprobs":[[-0.5,3,null]]}}'
    merged = orjson.loads(_merged_event(event, [[-0.1, 1, None]])[6:])
    assert merged["meta_info"]["input_token_logprobs"] == [[-0.1, 1, None], [-0.5, 3, None]]
    assert _merged_event(b"data: [DONE]", [[-0.1, 1, None]]) == b"data: [DONE]"


async def test_the_prefill_side_is_counted_on_its_worker_and_in_the_pd_metrics() -> None:
    from common.pd_metrics import PD_PREFILL_DURATION, PD_TTFT
    from common.telemetry import REGISTRY

    def samples(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"backend_type": "pd", "model": "mock-model", "runtime": "sglang"}) or 0.0

    assert PD_TTFT is not None and PD_PREFILL_DURATION is not None
    ttft, prefill_count = samples("gw_pd_ttft_seconds_count"), samples("gw_pd_prefill_duration_seconds_count")
    async with pd_pair() as (prefill, decode, pair, dispatch):
        prefill_request, decode_request = requests(pair, "/v1/chat/completions", chat())
        answer = await dispatch.open(prefill_request, decode_request, model="mock-model")
        sent = Sent()
        await answer.forward(ResponseWriter(sent, b"rid-1", ResponseClock(0.0), OPENAI_SSE))
        assert pair.prefill.handle.load.in_flight == 0
        assert samples("gw_pd_ttft_seconds_count") == ttft + 1
        assert samples("gw_pd_prefill_duration_seconds_count") == prefill_count + 1

        failing = requests(pair, "/v1/chat/completions", chat(mock={"pd_fault": ["prefill_drop", "decode_hang"]}))
        with pytest.raises(PdFailure):
            await dispatch.open(*failing)
        assert pair.prefill.handle.load.in_flight == 0
        assert pair.prefill.handle.load.breaker.failures == 1

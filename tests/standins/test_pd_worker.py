"""The prefill and decode stand-ins: bootstrap fields checked as SGLang checks them, the two sides
meeting by bootstrap_room on the prefill's bootstrap server, and faults on command."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.pd_fleet import PdWorker, serving_pd_worker


def _chat(prefill: PdWorker, room: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
        "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": room, **extra,
    }


async def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            return response.status, await response.json(content_type=None)


@pytest.mark.parametrize("missing", ["bootstrap_host", "bootstrap_port", "bootstrap_room"])
async def test_a_request_without_its_bootstrap_fields_is_refused_with_400(missing: str) -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        body = _chat(prefill, 7)
        del body[missing]
        for worker in (prefill, decode):
            status, answer = await _post(worker.url, body)
            assert status == 400
            assert answer["error"]["param"] == missing
            assert worker.pd.received == type(worker.pd.received)()


async def test_wrong_bootstrap_types_are_refused() -> None:
    async with serving_pd_worker("decode") as decode:
        for bad in ({"bootstrap_room": -1}, {"bootstrap_room": 2**63}, {"bootstrap_port": "x"}, {"bootstrap_host": ""},
                    {"bootstrap_room": [1, 2], "bootstrap_host": ["h"], "bootstrap_port": [None, None]}):
            body = {"model": "m", "messages": [], "bootstrap_host": "h", "bootstrap_port": None, "bootstrap_room": 1, **bad}
            status, _ = await _post(decode.url, body)
            assert status == 400, bad


async def test_decode_answers_once_its_prefill_made_the_room_ready() -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        body = _chat(prefill, 42)
        (p_status, p_answer), (d_status, d_answer) = await asyncio.gather(_post(prefill.url, body), _post(decode.url, body))
        assert p_status == d_status == 200
        assert d_answer["object"] == "chat.completion"
        assert decode.pd.received[0] == {
            "path": "/v1/chat/completions", "bootstrap_host": "127.0.0.1",
            "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": 42,
        }
        assert prefill.pd.ready == 1 and decode.pd.kv_waits == 1 and decode.pd.kv_failures == 0


async def test_decode_fails_when_the_kv_never_comes() -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode", kv_timeout_s=0.2) as decode:
        status, answer = await _post(decode.url, _chat(prefill, 5))
        assert status == 500
        assert "KV transfer failed for bootstrap_room 5" in answer["error"]["message"]
        assert decode.pd.kv_failures == 1


async def test_a_failed_prefill_fails_its_decode() -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        body = _chat(prefill, 9, mock={"pd_fault": "prefill_fail"})
        (p_status, _), (d_status, d_answer) = await asyncio.gather(_post(prefill.url, body), _post(decode.url, body))
        assert p_status == 500 and d_status == 500
        assert "prefill side failed" in d_answer["error"]["message"]
        assert prefill.pd.failed == 1


async def test_decode_faults_on_command_leave_the_prefill_alone() -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode") as decode:
        body = _chat(prefill, 11, mock={"pd_fault": ["decode_fail"]})
        (p_status, _), (d_status, d_answer) = await asyncio.gather(_post(prefill.url, body), _post(decode.url, body))
        assert p_status == 200 and d_status == 500
        assert "decode failed on command" in d_answer["error"]["message"]


async def test_an_unknown_fault_is_refused() -> None:
    async with serving_pd_worker("prefill") as prefill:
        status, answer = await _post(prefill.url, _chat(prefill, 1, mock={"pd_fault": "explode"}))
        assert status == 400 and answer["error"]["param"] == "mock.pd_fault"


async def test_failures_are_reported_in_sglang_words() -> None:
    async with serving_pd_worker("prefill") as prefill, serving_pd_worker("decode", kv_timeout_s=0.2) as decode:
        status, answer = await _post(prefill.url, _chat(prefill, 21, mock={"pd_fault": "prefill_bootstrap_fail"}))
        assert status == 500 and answer["error"]["message"].startswith("Prefill bootstrap failed for request")
        status, answer = await _post(prefill.url, _chat(prefill, 22, mock={"pd_fault": "prefill_transfer_fail"}))
        assert status == 500 and answer["error"]["message"].startswith("Prefill transfer failed for request")
        status, answer = await _post(decode.url, _chat(prefill, 23, mock={"pd_fault": "decode_bootstrap_fail"}))
        assert status == 500 and answer["error"]["message"].startswith("Decode handshake failed for request")
        status, answer = await _post(decode.url, _chat(prefill, 24, mock={"pd_fault": "decode_transfer_fail"}))
        assert status == 500 and answer["error"]["message"].startswith("Decode transfer failed for request")
        # The KV that never comes is a failed transfer; a bootstrap server out of reach a failed handshake.
        status, answer = await _post(decode.url, _chat(prefill, 25))
        assert answer["error"]["message"].startswith("Decode transfer failed") and "bootstrap_room=25" in answer["error"]["message"]
        unreachable = {**_chat(prefill, 26), "bootstrap_port": 1}
        status, answer = await _post(decode.url, unreachable)
        assert status == 500 and answer["error"]["message"].startswith("Decode handshake failed")

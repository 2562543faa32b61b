"""Gateway-made errors: one envelope, X-GW-Error-Code, and the spec's statuses."""

from __future__ import annotations

import pytest

from tests.conftest import RunningWorker, record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


def assert_envelope(response, status: int, code: object, error_type: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-gw-error-code"] == str(code)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == error_type and error["message"]
    return error


async def test_unknown_model_is_404_model_not_found(gateway, worker: RunningWorker) -> None:
    response = await gateway.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert_envelope(response, 404, "model_not_found", "not_found_error")
    assert not worker.requests()


async def test_known_model_without_ready_worker_is_503(make_gateway, worker: RunningWorker) -> None:
    client = make_gateway([record_for(worker, status="pending")])
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert_envelope(response, 503, "no_healthy_workers", "service_unavailable")


async def test_no_workers_at_all_gives_404_for_a_named_model(make_gateway) -> None:
    client = make_gateway([])
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert_envelope(response, 404, "model_not_found", "not_found_error")


async def test_route_without_model_and_no_workers_is_503(make_gateway) -> None:
    client = make_gateway([])
    response = await client.post("/generate", json={"text": "hi"})
    assert_envelope(response, 503, "no_healthy_workers", "service_unavailable")


async def test_body_over_max_payload_is_413(make_gateway, worker: RunningWorker) -> None:
    client = make_gateway([record_for(worker)], max_payload_size=200)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 500}]}
    response = await client.post("/v1/chat/completions", json=big)
    assert_envelope(response, 413, "payload_too_large", "payload_too_large")
    assert not worker.requests()


async def test_body_at_the_limit_is_accepted(make_gateway, worker: RunningWorker) -> None:
    import orjson

    raw = orjson.dumps(CHAT)
    client = make_gateway([record_for(worker)], max_payload_size=len(raw))
    response = await client.post("/v1/chat/completions", content=raw)
    assert response.status_code == 200


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe"])
async def test_malformed_json_is_400_json_parse_error(gateway, worker: RunningWorker, raw: bytes) -> None:
    response = await gateway.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert_envelope(response, 400, "json_parse_error", "invalid_request_error")
    assert not worker.requests()


async def test_validation_failure_is_400_with_numeric_code_before_any_worker(gateway, worker: RunningWorker) -> None:
    response = await gateway.post("/v1/chat/completions", json={**CHAT, "temperature": 3})
    error = assert_envelope(response, 400, 400, "invalid_request_error")
    assert "temperature" in error["message"]
    assert not worker.requests()


@pytest.mark.parametrize("path", ["/v1/embeddings", "/generate", "/v1/rerank"])
async def test_non_string_model_on_passthrough_routes_is_400(gateway, path: str) -> None:
    response = await gateway.post(path, json={"model": 42, "input": "x"})
    assert_envelope(response, 400, 400, "invalid_request_error")


async def test_wrong_method_is_405_envelope(gateway) -> None:
    response = await gateway.get("/v1/chat/completions")
    assert_envelope(response, 405, "method_not_allowed", "method_not_allowed")
    assert response.headers["allow"] == "POST"


async def test_unknown_route_is_404_envelope(gateway) -> None:
    response = await gateway.post("/v1/does-not-exist", json={})
    assert_envelope(response, 404, "endpoint_not_found", "not_found_error")

"""The gateway as a user runs it: real processes on loopback, driven by the openai SDK with strict
response validation, under uvicorn and under daphne."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.embedded]  # also in CI's SQLite pass

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def sdk(gateway, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, _strict_response_validation=True, max_retries=0)


def test_openai_sdk_chat_streaming_completions_and_models(start_gateway, mock_worker_process) -> None:
    gateway = start_gateway("--worker-urls", mock_worker_process.url, "--model-alias", "fast=mock-model")
    client = sdk(gateway)

    models = client.models.list()
    assert [m.id for m in models.data] == ["mock-model"]
    assert models.data[0].owned_by == "self_hosted"

    chat = client.chat.completions.create(model="fast", messages=MESSAGES, max_completion_tokens=5)
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 5

    chunks = list(
        client.chat.completions.create(
            model="mock-model", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].choices == []

    completion = client.completions.create(model="mock-model", prompt="Once upon", max_tokens=3)
    assert completion.object == "text_completion" and completion.choices[0].text

    # Streamed completions: the SDK's model has no null finish_reason, which every engine sends on
    # intermediate chunks (OpenAI too), so this one is read without strict validation.
    loose = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
    streamed = list(loose.completions.create(model="mock-model", prompt="Once", max_tokens=3, stream=True))
    assert streamed and all(c.object == "text_completion" for c in streamed)
    assert streamed[-1].choices[0].finish_reason == "length"


def test_sdk_sees_spec_errors(start_gateway, mock_worker_process) -> None:
    gateway = start_gateway("--worker-urls", mock_worker_process.url, "--api-key", "sk-e2e")
    with pytest.raises(openai.AuthenticationError):
        sdk(gateway, "sk-wrong").chat.completions.create(model="mock-model", messages=MESSAGES)
    with pytest.raises(openai.NotFoundError) as missing:
        sdk(gateway, "sk-e2e").chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as invalid:
        sdk(gateway, "sk-e2e").chat.completions.create(model="mock-model", messages=MESSAGES, temperature=5)
    assert invalid.value.response.headers["x-gw-error-code"] == "400"


def _open_stream_and_leave(url: str, body: bytes) -> bytes:
    """Start a streaming request over a raw socket, read the first bytes of the stream, hang up."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        sock.sendall(request)
        received = b""
        while b"data:" not in received:
            data = sock.recv(4096)
            if not data:
                break
            received += data
    return received


def test_client_disconnect_closes_the_upstream_stream(start_gateway, mock_worker_process) -> None:
    gateway = start_gateway("--worker-urls", mock_worker_process.url)
    stats_url = mock_worker_process.url + "/_mock/stats"
    before = httpx.get(stats_url).json()
    body = b'{"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tokens":500,"delay_ms":20}}'
    first = _open_stream_and_leave(gateway.url, body)
    assert b"200 OK" in first and b"data:" in first
    deadline = time.monotonic() + 5
    stats = before
    while time.monotonic() < deadline:
        stats = httpx.get(stats_url).json()
        if stats["streams_disconnected"] > before["streams_disconnected"]:
            break
        time.sleep(0.05)
    # The worker saw its client (the gateway) go away long before its 10 s stream would end.
    assert stats["streams_disconnected"] == before["streams_disconnected"] + 1
    assert stats["streams_completed"] == before["streams_completed"]
    assert stats["in_flight"] == 0
    # The half-read upstream connection was closed, not handed to the next request.
    chat = {"model": "mock-model", "messages": MESSAGES}
    assert httpx.post(gateway.url + "/v1/chat/completions", json=chat).status_code == 200
    logged = httpx.get(mock_worker_process.url + "/_mock/requests", params={"path": "/v1/chat/completions"}).json()
    left, after = logged[-2], logged[-1]
    assert left["json"]["stream"] is True and "stream" not in after["json"]
    assert left["client_port"] != after["client_port"]


def test_worker_that_starts_after_the_gateway_becomes_routable(start_gateway, spawn) -> None:
    from tests.e2e.conftest import free_port

    port = free_port()
    gateway = start_gateway("--worker-urls", f"http://127.0.0.1:{port}", wait_ready=False)
    assert httpx.get(gateway.url + "/readiness").status_code == 503
    assert httpx.get(gateway.url + "/v1/models").status_code == 503
    spawn("late-worker", ["runmockworker", "--host", "127.0.0.1", "--port", str(port), "--model", "late"], port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and httpx.get(gateway.url + "/readiness").status_code != 200:
        time.sleep(0.2)
    assert httpx.get(gateway.url + "/readiness").status_code == 200
    reply = sdk(gateway).chat.completions.create(model="late", messages=MESSAGES)
    assert reply.choices[0].message.role == "assistant"


def test_request_id_round_trip(start_gateway, mock_worker_process) -> None:
    gateway = start_gateway("--worker-urls", mock_worker_process.url)
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "mock-model", "messages": MESSAGES},
        headers={"X-Request-ID": "e2e-trace-1"},
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "e2e-trace-1"
    seen = httpx.get(mock_worker_process.url + "/_mock/requests").json()
    assert seen[-1]["headers"]["x-request-id"] == "e2e-trace-1"


def test_daphne_starts_the_gateway_with_the_reactor_and_stops_it_cleanly(spawn, mock_worker_process) -> None:
    """No lifespan under daphne: the fleet starts with Twisted's reactor (the worker is registered and
    health-checked before any request reaches the gateway) and stops before it (sessions closed)."""
    from tests.e2e.conftest import free_port, wait_for

    port = free_port()
    gateway = spawn(
        "gateway-daphne-lifecycle",
        ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", "daphne",
         "--worker-urls", mock_worker_process.url, "--health-check-interval-secs", "0.3",
         "--health-success-threshold", "1", "--worker-startup-check-interval", "0.3"],
        port,
        wait=False,
    )
    wait_for(lambda: "pending -> ready" in gateway.log(), 30, "worker ready without any request", gateway)
    health_checks = [r for r in httpx.get(mock_worker_process.url + "/_mock/requests").json() if r["path"] == "/health"]
    assert health_checks  # the gateway's health checker ran before anyone called the gateway
    reply = sdk(gateway).chat.completions.create(model="mock-model", messages=MESSAGES)
    assert reply.choices[0].message.role == "assistant"
    gateway.stop()
    log = gateway.log()
    assert "gateway stopped" in log
    assert "Unclosed" not in log

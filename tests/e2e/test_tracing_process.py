"""Tracing end to end (issue 26 item 2, D74): a real `manage.py rungateway --enable-trace` process
exports over OTLP/gRPC to our stand-in collector (standins/otlp_receiver.py); a client's traceparent
is continued through the gateway to an HTTP worker process, which sees the client's trace id and the
gateway's span as its parent."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from standins.otlp_receiver import OtlpReceiver, ReceivedSpan

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    found = OtlpReceiver()
    found.start()
    yield found
    found.stop()


@pytest.fixture(params=["uvicorn"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_clients_trace_reaches_the_collector_and_the_worker(start_gateway, mock_worker_process, receiver) -> None:
    gateway = start_gateway(
        "--worker-urls", mock_worker_process.url, "--enable-trace", "--otlp-traces-endpoint", receiver.endpoint,
        env={"OTEL_SERVICE_NAME": "gateway-e2e", "OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "congo=t61rcWkgMzE"}
    response = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=10, trust_env=False)
    assert response.status_code == 200

    def complete(spans: list[ReceivedSpan]) -> bool:
        return any(s.kind == "SERVER" for s in spans) and any(s.name.startswith("attempt") for s in spans)

    spans = receiver.wait_for(complete)
    [request] = [s for s in spans if s.kind == "SERVER"]
    [attempt] = [s for s in spans if s.name.startswith("attempt")]
    assert (request.trace_id, request.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert attempt.trace_id == CLIENT_TRACE and attempt.parent_span_id == request.span_id
    assert request.service_name == "gateway-e2e"
    assert request.attributes["gen_ai.request.model"] == "mock-model"
    assert request.attributes["gen_ai.usage.output_tokens"] == response.json()["usage"]["completion_tokens"]
    seen = httpx.get(mock_worker_process.url + "/_mock/requests", timeout=5, trust_env=False).json()
    [relayed] = [r for r in seen if r["path"] == "/v1/chat/completions"]
    assert relayed["headers"]["traceparent"] == f"00-{CLIENT_TRACE}-{attempt.span_id}-01"
    assert relayed["headers"]["tracestate"] == "congo=t61rcWkgMzE"

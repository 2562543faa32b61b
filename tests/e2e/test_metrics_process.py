"""A real `manage.py rungateway` process: gw_* metrics on --prometheus-port, probes on
--health-check-port."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import free_port

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


def _families(url: str) -> dict:
    response = httpx.get(url, timeout=5, trust_env=False)
    assert response.status_code == 200
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def test_metrics_port_exports_the_gateway_metrics(start_gateway, mock_worker_process) -> None:
    metrics_port = free_port()
    gateway = start_gateway("--worker-urls", mock_worker_process.url, "--prometheus-port", str(metrics_port),
                            "--prometheus-host", "127.0.0.1")
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
    assert httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10).status_code == 200
    assert httpx.post(gateway.url + "/v1/chat/completions", content=b"{", timeout=10).status_code == 400
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    deadline = time.monotonic() + 10
    while True:  # worker gauges are sampled once a second
        families = _families(url)
        health = [s.value for s in families["gw_worker_health"].samples] if "gw_worker_health" in families else []
        if health == [1] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    requests = {tuple(sorted(s.labels.items())): s.value for s in families["gw_http_requests"].samples}
    assert requests[(("method", "POST"), ("path", "/v1/chat/completions"))] == 3
    assert families["gw_router_requests"].type == "counter"
    streaming = {s.labels["streaming"]: s.value for s in families["gw_router_requests"].samples
                 if s.name == "gw_router_requests_total"}
    assert streaming == {"false": 1, "true": 1}
    ttft = [s for s in families["gw_router_ttft_seconds"].samples if s.name == "gw_router_ttft_seconds_count"]
    assert [s.value for s in ttft] == [1]
    assert [s.value for s in families["gw_worker_health"].samples] == [1]
    assert families["gw_runtime_event_loop_delay_seconds"].type == "histogram"
    assert "process_cpu_seconds" in families  # single-process mode: process collector too


def test_health_check_port_serves_the_probes(start_gateway, mock_worker_process) -> None:
    probe_port = free_port()
    start_gateway("--worker-urls", mock_worker_process.url, "--health-check-port", str(probe_port),
                  "--prometheus-port", str(free_port()))
    base = f"http://127.0.0.1:{probe_port}"
    assert httpx.get(base + "/health", timeout=5).json() == {"status": "ok"}
    assert httpx.get(base + "/liveness", timeout=5).status_code == 200
    ready = httpx.get(base + "/readiness", timeout=5)
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "workers": {"ready": 1, "total": 1}}
    assert httpx.post(base + "/health", timeout=5).status_code == 405
    assert httpx.get(base + "/v1/models", timeout=5).status_code == 404

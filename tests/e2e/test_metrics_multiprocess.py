"""Two real `manage.py rungateway` processes sharing one PROMETHEUS_MULTIPROC_DIR and one store, both
configured with the same --prometheus-port: the first to bind serves /metrics with the sums over both
processes; when it exits, the other takes the port over and the exited process's counters stay in the
sums while its live gauges drop out."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Process, free_port, wait_for

pytestmark = pytest.mark.e2e

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
# A stream that stays open until the test closes it (1,000 tokens, 20 ms apart).
LONG_STREAM = {**CHAT, "stream": True, "mock": {"tokens": 1000, "delay_ms": 20}}
CHAT_PATH = (("method", "POST"), ("path", "/v1/chat/completions"))
# A clean stop on SIGTERM: uvicorn re-raises the signal once it has shut down, daphne exits 0.
STOPPED = (0, -signal.SIGTERM)


def _scrape(url: str) -> dict:
    response = httpx.get(url, timeout=5, trust_env=False)
    assert response.status_code == 200
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def _sum(families: dict, family: str, sample: str, **labels: str) -> float:
    if family not in families:
        return 0.0
    return sum(
        s.value for s in families[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _scrape_until(url: str, check, what: str, timeout: float = 30.0) -> dict:
    """Scrape until ``check(families)`` holds (gauges are sampled once a second, the port may be
    changing hands)."""
    deadline = time.monotonic() + timeout
    families: dict = {}
    while time.monotonic() < deadline:
        try:
            families = _scrape(url)
        except httpx.HTTPError:
            families = {}
        if families and check(families):
            return families
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached within {timeout}s; last scrape: {sorted(families)}")


def _live_files(directory: Path, pid: int) -> list[str]:
    return sorted(p.name for p in directory.glob(f"gauge_live*_{pid}.db"))


def _chat(gateway: Process, stream: bool = False) -> None:
    response = httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "stream": stream}, timeout=10)
    assert response.status_code == 200, response.text


def test_two_gateway_processes_export_one_sum_and_hand_the_port_over(
    start_gateway, mock_worker_process, tmp_path: Path
) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    metrics_port = free_port()
    flags = ("--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1",
             "--health-check-interval-secs", "1")
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
    # No --worker-urls: the worker is registered once through the API, in the shared store.
    first = start_gateway(*flags, wait_ready=False, env=env)
    second = start_gateway(*flags, wait_ready=False, env=env)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    assert "is taken" in second.log() and "takes it over" in second.log()

    registered = httpx.post(first.url + "/workers", json={"url": mock_worker_process.url}, timeout=10)
    assert registered.status_code == 202, registered.text
    for gateway in (first, second):  # the second sees the stored worker on its periodic refresh
        wait_for(lambda gateway=gateway: httpx.get(gateway.url + "/readiness").status_code == 200, 30,
                    "/readiness", gateway)

    # Counters: a known number of requests through each process (plain, then one streamed).
    sent = [(first, 2), (second, 3)]
    for gateway, plain in sent:
        for _ in range(plain):
            _chat(gateway)
        _chat(gateway, stream=True)

    # A live gauge summed over the processes: one stream held open in each.
    with ExitStack() as stack:
        chunks = []  # kept: dropping a response's iterator closes its connection
        for gateway in (first, second):
            response = stack.enter_context(
                httpx.stream("POST", gateway.url + "/v1/chat/completions", json=LONG_STREAM, timeout=30)
            )
            assert response.status_code == 200
            chunks.append(response.iter_raw())
            next(chunks[-1])  # the request is in flight at the gateway
        _scrape_until(url, lambda f: _sum(f, "gw_http_connections_active", "gw_http_connections_active") == 2,
                      "two requests in flight over two processes")
    total = sum(plain + 1 for _, plain in sent) + 2  # and the two held streams

    def chats(families: dict) -> float:
        return {tuple(sorted(s.labels.items())): s.value for s in families["gw_http_requests"].samples}[CHAT_PATH]

    families = _scrape_until(  # counters reach the files within a second of the requests
        url, lambda f: _sum(f, "gw_http_connections_active", "gw_http_connections_active") == 0
        and _sum(f, "gw_worker_health", "gw_worker_health") == 1 and chats(f) == total,
        "no request in flight, the worker ready, every request counted",
    )
    requests = {tuple(sorted(s.labels.items())): s.value for s in families["gw_http_requests"].samples}
    assert requests[CHAT_PATH] == total
    assert _sum(families, "gw_router_requests", "gw_router_requests_total") == total
    assert _sum(families, "gw_router_requests", "gw_router_requests_total", streaming="true") == 4
    assert _sum(families, "gw_http_responses", "gw_http_responses_total",
                path="/v1/chat/completions", status_code="200") == total
    # One series per gauge, not one per process (live modes), and no per-process collectors.
    assert [s.labels for s in families["gw_http_connections_active"].samples] == [{}]
    assert "process_cpu_seconds" not in families
    assert _live_files(directory, first.popen.pid) and _live_files(directory, second.popen.pid)

    # The process holding the port exits: its live gauges go, its counters stay, the other takes over.
    first.stop()
    assert first.popen.returncode in STOPPED, first.log()
    assert _live_files(directory, first.popen.pid) == []
    assert (directory / f"counter_{first.popen.pid}.db").exists()
    families = _scrape_until(url, lambda f: "gw_http_requests" in f, "the second process serving the port")
    requests = {tuple(sorted(s.labels.items())): s.value for s in families["gw_http_requests"].samples}
    assert requests[CHAT_PATH] == total
    assert _sum(families, "gw_router_requests", "gw_router_requests_total") == total
    assert _sum(families, "gw_http_connections_active", "gw_http_connections_active") == 0

    # The survivor keeps adding to the same sums (written to its file within a second).
    _chat(second)
    families = _scrape_until(url, lambda f: chats(f) == total + 1, "the survivor's request counted", timeout=5)
    assert chats(families) == total + 1

    second.stop()
    assert second.popen.returncode in STOPPED, second.log()
    assert _live_files(directory, second.popen.pid) == []

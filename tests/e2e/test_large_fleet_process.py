"""A gateway process with hundreds of --worker-urls (one stand-in reached through as many loopback
addresses): it starts without the start-up race, all become ready, ``--log-level warning`` keeps the
per-worker INFO lines out of its log, and SIGTERM ends it promptly."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable

import httpx
import pytest

from tests.e2e.conftest import Process, free_port, wait_for

pytestmark = pytest.mark.e2e

FLEET = 300


def _loopback_urls(port: int, count: int) -> list[str]:
    """``count`` distinct worker URLs that all reach one server bound to 0.0.0.0:``port``."""
    return [f"http://127.0.{1 + index // 250}.{1 + index % 250}:{port}" for index in range(count)]


def test_hundreds_of_worker_urls_start_become_ready_stay_quiet_and_stop_promptly(
    spawn: Callable[..., Process],
) -> None:
    worker_port = free_port()
    spawn("mockworker", ["runmockworker", "--host", "0.0.0.0", "--port", str(worker_port), "--model", "fleet"],
          worker_port)
    port = free_port()
    urls = _loopback_urls(worker_port, FLEET)
    gateway = spawn(
        "gateway", ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                    "--health-check-interval-secs", "1", "--worker-urls", *urls],
        port, ready_path="/liveness",
    )

    def all_ready() -> bool:
        listed = httpx.get(gateway.url + "/workers", timeout=5).json()["workers"]
        return len(listed) == FLEET and all(worker["status"] == "ready" for worker in listed)

    wait_for(all_ready, 90, f"{FLEET} ready workers", gateway)
    answer = httpx.post(gateway.url + "/v1/chat/completions", timeout=10,
                        json={"model": "fleet", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200

    started = time.monotonic()
    gateway.popen.send_signal(signal.SIGTERM)
    try:
        gateway.popen.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the gateway did not stop within 15 s of SIGTERM with {FLEET} workers:\n{gateway.log()}")
    assert time.monotonic() - started < 15
    log = gateway.log()
    assert " INFO " not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]

"""The metrics listener when its port is taken (several gateway processes, one port), and a process's
live gauges leaving the multiprocess directory when it exits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from administration.metrics_server import MetricsListener

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def taken_port() -> Iterator[socket.socket]:
    """A port another process could hold: a listening socket on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def _scrape(port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False)


def test_a_taken_port_without_take_over_is_given_up(taken_port: socket.socket) -> None:
    listener = MetricsListener("127.0.0.1", taken_port.getsockname()[1], take_over=False)
    try:
        assert listener.start() is False
        assert not listener.serving and not listener.waiting
    finally:
        listener.stop()


def test_a_taken_port_is_taken_over_once_freed(taken_port: socket.socket) -> None:
    port = taken_port.getsockname()[1]
    listener = MetricsListener("127.0.0.1", port, take_over=True, retry_secs=0.05)
    try:
        assert listener.start() is False
        taken_port.close()  # the process that held it exits
        deadline = time.monotonic() + 10
        while not listener.serving:
            assert time.monotonic() < deadline, "port not taken over"
            time.sleep(0.02)
        response = _scrape(port)
        assert response.status_code == 200 and "gw_http_connections_active" in response.text
    finally:
        listener.stop()
    with pytest.raises(httpx.ConnectError):
        _scrape(port)


def test_stop_ends_the_wait_for_the_port(taken_port: socket.socket) -> None:
    listener = MetricsListener("127.0.0.1", taken_port.getsockname()[1], take_over=True, retry_secs=0.05)
    assert listener.start() is False
    assert listener.waiting
    listener.stop()
    assert not listener.waiting and not listener.serving


def test_a_process_leaves_no_live_gauges_behind_at_exit(tmp_path: Path) -> None:
    """Any process that imports the metrics module in multiprocess mode (daphne sends no lifespan
    shutdown; manage.py commands never start the gateway) drops its live gauges when it exits; its
    counters stay in the sums."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "DJANGO_SETTINGS_MODULE": "gateway_project.settings_test"}
    script = (
        "import os\n"
        "from common import telemetry as metrics\n"
        "assert metrics.MULTIPROCESS\n"
        "metrics.HTTP_ACTIVE.inc()\n"
        "metrics.WORKER_HEALTH.labels('http://w:1').set(1)\n"
        "metrics.LOOP_STALLS.inc()\n"
        "print(os.getpid())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    names = sorted(p.name for p in directory.iterdir())
    assert f"counter_{pid}.db" in names
    assert not [name for name in names if name.startswith("gauge_live")], names

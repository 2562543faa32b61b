"""The console's fleet page in a real browser: a gateway process (uvicorn, metrics in multiprocess
mode) relaying steady traffic to a mock worker process, and Chromium driven by Playwright watching
the charts refresh. The screenshot lands in the test's tmp_path."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import Process, free_port
from tests.e2e.browser import PASSWORD, USERNAME, browser, make_staff_user, needs_chromium

__all__ = ["browser"]  # the Chromium fixture (tests/e2e/browser.py), used by the test below

pytestmark = pytest.mark.e2e

FLEET = "/admin/administration/worker/fleet/"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# 8 tokens, 40 ms apart: each request stays in flight ~0.3 s, so in-flight and rate are both visible.
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}], "mock": {"delay_ms": 40}}
ENGINE_LOAD = {"num_running_reqs": 3, "num_waiting_reqs": 2, "token_usage": 0.42}

# The drawn state the page's script exposes: refresh count, server clock, and each chart's data attributes.
READ_STATE = """() => {
  const root = document.getElementById('gw-fleet');
  const chart = (id) => {
    const svg = document.getElementById(id);
    return {points: Number(svg.dataset.points), series: Number(svg.dataset.series),
            latest: Number(svg.dataset.latest), paths: Array.from(svg.querySelectorAll('path')).map(p => p.getAttribute('d'))};
  };
  return {refreshes: Number(root.dataset.refreshes), serverTime: Number(root.dataset.serverTime),
          counters: root.dataset.counters, rate: chart('gw-chart-rate'), inflight: chart('gw-chart-inflight'),
          engine: chart('gw-chart-engine'), usage: chart('gw-chart-usage'),
          health: Array.from(document.querySelectorAll('#gw-health svg.gw-band')).map(b => Number(b.dataset.points))};
}"""


@pytest.fixture
def fleet_gateway(spawn: Callable[..., Process], mock_worker_process: Process, tmp_path: Path) -> Process:
    """A gateway relaying to the mock worker, polling its engine load twice a second, with its metrics
    in a multiprocess directory (the page then reads the counters from the files); a staff superuser."""
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    port = free_port()
    gateway = spawn(
        "gateway-fleet",
        ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", "uvicorn",
         "--worker-urls", mock_worker_process.url, "--load-monitor-interval", "0.5",
         "--health-check-interval-secs", "0.3", "--health-success-threshold", "1",
         "--worker-startup-check-interval", "0.3"],
        port,
        ready_path="/readiness",
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
    )
    make_staff_user(gateway)
    return gateway


@pytest.fixture
def traffic(fleet_gateway: Process) -> Iterator[list[int]]:
    """Three clients sending chat completions back to back until the test ends; yields the statuses."""
    stop = threading.Event()
    statuses: list[int] = []

    def send() -> None:
        with httpx.Client(base_url=fleet_gateway.url, timeout=10, trust_env=False) as client:
            while not stop.is_set():
                statuses.append(client.post("/v1/chat/completions", json=CHAT).status_code)

    threads = [threading.Thread(target=send, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    yield statuses
    stop.set()
    for thread in threads:
        thread.join(timeout=15)


def log_in(page: Page, base_url: str, next_path: str) -> None:
    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()


def read_state(page: Page) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate(READ_STATE)
    return state


@needs_chromium
def test_fleet_charts_refresh_with_live_traffic(
    fleet_gateway: Process, mock_worker_process: Process, traffic: list[int], browser: Browser, tmp_path: Path
) -> None:
    gateway, worker_url = fleet_gateway, mock_worker_process.url
    assert httpx.post(f"{worker_url}/_mock/load", json=ENGINE_LOAD, timeout=5).status_code == 200
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(30_000)

    # The worker list links to the page; the page opens on the worker's row.
    log_in(page, gateway.url, "/admin/administration/worker/")
    page.get_by_role("link", name="Fleet charts").click()
    expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
    row = page.locator("#gw-fleet-rows tr", has=page.get_by_role("link", name=worker_url, exact=True))
    expect(row).to_have_count(1)

    # Faster refreshes for the test (the select changes the interval without a reload).
    page.locator("#gw-refresh").select_option("1")
    # Two refreshes with a request rate (the first answer only sets the counters' baseline), the engine's
    # load report in, and the health band drawn.
    page.wait_for_function(
        """() => {
          const rate = document.getElementById('gw-chart-rate').dataset;
          const engine = document.getElementById('gw-chart-engine').dataset;
          return Number(rate.points) >= 2 && Number(rate.latest) > 0 && Number(engine.latest) > 0;
        }"""
    )
    first = read_state(page)
    assert first["counters"] == "all_processes"  # read from the multiprocess files
    assert first["refreshes"] >= 3 and first["rate"]["series"] >= 1 and first["rate"]["paths"][0].count("L") >= 1
    assert first["inflight"]["points"] >= 2
    assert first["engine"]["latest"] == ENGINE_LOAD["num_running_reqs"]  # solid line: running
    assert first["usage"]["latest"] == pytest.approx(42.0)
    assert first["health"] and first["health"][0] >= 2
    expect(row.locator("td.field-status")).to_have_text("Ready")
    expect(row.locator("td.field-breaker")).to_have_text("closed")
    expect(row.locator("td.field-model")).to_have_text("mock-model")
    expect(row.locator("td.field-engine")).to_contain_text("3 running · 2 waiting · 42% KV")
    assert float(row.locator("td.field-rate").inner_text()) > 0
    expect(page.locator('[data-summary="ready"]')).to_have_text("1 / 1")

    # One more refresh redraws the charts with new data, without a page reload.
    page.evaluate("window.__same_document = true")
    page.wait_for_function("(n) => Number(document.getElementById('gw-fleet').dataset.refreshes) > n", arg=first["refreshes"])
    second = read_state(page)
    assert second["serverTime"] > first["serverTime"]
    assert second["rate"]["paths"] != first["rate"]["paths"]
    assert second["rate"]["points"] >= first["rate"]["points"]
    assert page.evaluate("window.__same_document") is True

    screenshot = tmp_path / "fleet.png"
    page.screenshot(path=str(screenshot), full_page=True)
    data = screenshot.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 30_000
    page.emulate_media(color_scheme="dark")  # the admin's dark theme: the charts use its colour variables
    page.screenshot(path=str(tmp_path / "fleet-dark.png"), full_page=True)
    assert traffic and set(traffic) == {200}, set(traffic)

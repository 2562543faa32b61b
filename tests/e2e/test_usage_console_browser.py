"""The console's usage page in a real browser: a gateway process (uvicorn), usage minutes and request
log rows written into its store (what the flush loop writes; the loop is tested on its own), a price
added through the gateway's POST /prices, and Chromium driven by Playwright reading the charts the
page's script drew, the tables, a refused parameter and the CSV export. Screenshots land in the
test's tmp_path."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.browser import PASSWORD, USERNAME, browser, make_staff_user, needs_chromium
from tests.e2e.conftest import ROOT, Process, free_port

__all__ = ["browser"]  # the Chromium fixture, used by the test below

pytestmark = pytest.mark.e2e

PAGE = "/admin/administration/usageminute/usage/"
SEED = """
from datetime import timedelta
from django.utils import timezone
from administration.models import RequestLogEntry, TenantBudget, UsageMinute
UsageMinute.objects.all().delete(); RequestLogEntry.objects.all().delete(); TenantBudget.objects.all().delete()
today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
for days, tenant, model, prompt, completion in [(0, "acme", "llama", 4000, 1000), (1, "acme", "llama", 2000, 500),
                                                (0, "globex", "qwen", 300, 100), (2, "globex", "llama", 900, 100)]:
    UsageMinute.objects.create(tenant=tenant, model=model, minute=today - timedelta(days=days), requests=3,
                               prompt_tokens=prompt, completion_tokens=completion)
TenantBudget.objects.create(tenant_id="acme", tokens=10000, period="day")
RequestLogEntry.objects.create(at=today, request_id="req-e2e-usage", tenant="acme", model="llama", worker="http://w",
                               surface="chat", route="/v1/chat/completions", status=200, outcome="success",
                               latency_ms=12.0, prompt_tokens=4000, completion_tokens=1000)
"""
READ_CHARTS = """() => Object.fromEntries(Array.from(document.querySelectorAll('svg[data-chart]')).map(svg => [
  svg.dataset.chart, {series: Number(svg.dataset.series), points: Number(svg.dataset.points),
                      total: Number(svg.dataset.total), paths: svg.querySelectorAll('path.gw-line').length}]))"""


@pytest.fixture
def usage_gateway(spawn: Callable[..., Process]) -> Process:
    port = free_port()
    gateway = spawn("gateway-usage", ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", "uvicorn"],
                    port, ready_path="/liveness")
    make_staff_user(gateway)
    seeded = subprocess.run([sys.executable, "manage.py", "shell", "-c", SEED], cwd=ROOT, env=gateway.env,
                            capture_output=True, text=True, timeout=60)
    assert seeded.returncode == 0, seeded.stderr
    return gateway


@needs_chromium
def test_the_usage_page_draws_usage_budgets_and_prices(usage_gateway: Process, browser: Browser, tmp_path: Path) -> None:
    gateway = usage_gateway
    with httpx.Client(base_url=gateway.url, timeout=10, trust_env=False) as client:  # no keys: the control plane is open
        added = client.post("/prices", json={"model": "llama", "input_per_million": 2, "output_per_million": 8})
        assert added.status_code == 201, added.text
        api = client.get("/usage", params={"group_by": "tenant"}).json()["data"]
        assert {row["tenant"]: row["requests"] for row in api} == {"acme": 6, "globex": 6}

    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(15_000)
    page.goto(gateway.url + "/admin/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("link", name="Usage and spend").click()
    expect(page).to_have_url(re.compile(re.escape(PAGE) + "$"))
    expect(page.locator('#gw-usage .gw-summary [data-summary="tokens"]')).to_have_text("8900")
    page.wait_for_function("document.querySelector('svg[data-chart=\"tenant_tokens\"]').dataset.series === '2'")
    charts = page.evaluate(READ_CHARTS)
    assert charts["tenant_tokens"] == {"series": 2, "points": 30, "total": 8900, "paths": 2}
    assert charts["model_tokens"]["series"] == 2 and charts["model_spend"]["series"] == 2
    expect(page.locator('[data-legend="tenant_tokens"]')).to_contain_text("acme")
    expect(page.locator("#gw-top-tenants tbody tr").first).to_contain_text("acme")
    expect(page.locator('#gw-budgets tr[data-tenant="acme"] td[data-left]')).to_have_text("5000")
    expect(page.locator("#gw-prices")).to_contain_text("llama")
    expect(page.locator("#gw-unpriced")).to_contain_text("qwen")
    expect(page.locator("#gw-recent")).to_contain_text("req-e2e-usage")
    page.screenshot(path=str(tmp_path / "usage.png"), full_page=True)

    # A refused parameter: the default view with the reason, never a server error.
    page.goto(gateway.url + PAGE + "?start=2026-02-30")
    expect(page.locator("#gw-usage-error")).to_contain_text("'start' is not a calendar date")
    expect(page.locator('#gw-usage .gw-summary [data-summary="tokens"]')).to_have_text("8900")

    # One tenant, and its CSV.
    page.goto(gateway.url + PAGE)
    page.locator('input[name="tenant"]').fill("globex")
    page.get_by_role("button", name="Show").click()
    expect(page.locator('#gw-usage .gw-summary [data-summary="tokens"]')).to_have_text("1400")
    with page.expect_download() as download:
        page.locator("#gw-usage-export").click()
    exported = Path(download.value.path()).read_text()
    assert exported.splitlines()[0] == "tenant,model,day,requests,errors,prompt_tokens,completion_tokens,cached_tokens,spend"
    assert {line.split(",")[0] for line in exported.splitlines()[1:]} == {"globex"}

"""The worker console in a real browser: the gateway (uvicorn) and a mock worker as real processes,
a staff user made with `manage.py ensure_admin`, and Chromium driven by Playwright. Screenshots of
every step land in the test's tmp_path."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.browser import PASSWORD, USERNAME, browser, make_staff_user, needs_chromium
from tests.e2e.conftest import Process, free_port

__all__ = ["browser"]  # the Chromium fixture, used by the tests below

pytestmark = pytest.mark.e2e

WORKER_KEY = "sk-e2e-worker-key-91c4"
STYLESHEET = "/static/admin/css/base.css"


@pytest.fixture
def console_gateway(spawn: Callable[..., Process]) -> Process:
    """One gateway under uvicorn with fast health checks, and a staff superuser in its database."""
    port = free_port()
    gateway = spawn(
        "gateway-uvicorn",
        ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", "uvicorn",
         "--health-check-interval-secs", "0.3", "--health-success-threshold", "1",
         "--worker-startup-check-interval", "0.3"],
        port,
        ready_path="/liveness",
    )
    make_staff_user(gateway)
    return gateway


class Shots:
    def __init__(self, page: Page, directory: Path) -> None:
        self.page = page
        self.directory = directory
        self.taken: list[Path] = []

    def __call__(self, name: str) -> None:
        path = self.directory / f"{len(self.taken) + 1:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.taken.append(path)
        assert WORKER_KEY not in self.page.content()  # never shown, on any page


def row_of(page: Page, url: str):  # noqa: ANN201 - a Playwright Locator
    return page.locator("#result_list tbody tr", has=page.get_by_role("link", name=url, exact=True))


@needs_chromium
def test_operator_adds_a_worker_sees_it_ready_and_drains_it(
    console_gateway: Process, mock_worker_process: Process, browser: Browser, tmp_path: Path
) -> None:
    gateway, worker_url = console_gateway, mock_worker_process.url
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(15_000)
    shot = Shots(page, tmp_path)

    # Log in.
    page.goto(gateway.url + "/admin/")
    expect(page).to_have_url(re.compile(r"/admin/login/"))
    shot("login")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#site-name")).to_have_text("Inference gateway")
    header = page.evaluate("getComputedStyle(document.querySelector('#header')).backgroundColor")
    assert header not in ("", "rgba(0, 0, 0, 0)"), "the admin stylesheet did not load"
    expect(page.get_by_role("link", name="Workers", exact=True).first).to_be_visible()
    shot("index")

    # Add the worker through the form.
    page.goto(gateway.url + "/admin/administration/worker/add/")
    expect(page.get_by_role("heading", name="Add worker")).to_be_visible()
    expect(page.locator('input[name="api_key"]')).to_have_attribute("type", "password")
    page.locator("#id_url").fill("ftp://nowhere:1")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".errornote")).to_be_visible()
    expect(page.locator(".errorlist")).to_contain_text("url must start with a lowercase http://")
    shot("add-form-error")
    page.locator("#id_url").fill(worker_url)
    page.locator("#id_api_key").fill(WORKER_KEY)
    page.locator("#id_labels").fill("zone=e2e\nteam=console")
    page.locator("#id_runtime_type").select_option("unspecified")
    shot("add-form")
    page.get_by_role("button", name="Save").click()

    expect(page).to_have_url(re.compile(r"/admin/administration/worker/$"))
    expect(page.locator("ul.messagelist")).to_contain_text(f"Worker {worker_url} added")
    expect(row_of(page, worker_url)).to_have_count(1)
    shot("list-after-add")

    # Wait (reloading) until its health checks make it ready.
    row = row_of(page, worker_url)
    deadline = time.monotonic() + 30
    while "Ready" not in row.locator("td.field-status_badge").inner_text():
        assert time.monotonic() < deadline, f"never ready:\n{gateway.log()}"
        time.sleep(0.5)
        page.reload()
    expect(row.locator("td.field-model_column")).to_have_text("mock-model")  # discovered from the engine
    expect(row.locator("td.field-runtime")).to_have_text("sglang")
    expect(row.locator("td.field-load")).to_have_text("0")
    expect(row.locator("td.field-breaker")).to_have_text("closed")
    expect(row.locator("td.field-is_healthy img")).to_have_attribute("alt", "True")
    shot("list-ready")

    # The filters and the search narrow the list.
    page.goto(gateway.url + "/admin/administration/worker/?status__exact=draining")
    expect(row_of(page, worker_url)).to_have_count(0)
    page.goto(gateway.url + "/admin/administration/worker/?q=mock-model")
    expect(row_of(page, worker_url)).to_have_count(1)

    # The detail page: read-only, the spec as JSON without the key, and the action buttons.
    href = row_of(page, worker_url).get_by_role("link", name=worker_url).get_attribute("href")
    assert href is not None
    page.goto(gateway.url + href)
    expect(page.get_by_role("heading", name="View worker")).to_be_visible()
    expect(page.locator("pre.gw-spec")).to_contain_text('"zone": "e2e"')
    expect(page.locator("pre.gw-spec")).not_to_contain_text("api_key")
    expect(page.locator(".field-status_badge .gw-badge")).to_have_text("Ready")
    shot("detail-ready")

    # Drain it from the detail page.
    page.get_by_role("button", name="Drain").click()
    expect(page.locator("ul.messagelist")).to_contain_text(f"Draining {worker_url}")
    expect(page.locator(".field-status_badge .gw-badge")).to_have_text("Draining")
    shot("detail-draining")
    found = re.search(r"/worker/([0-9a-f-]{36})/change/", href)
    assert found is not None, href
    worker_id = found.group(1)
    api = httpx.get(f"{gateway.url}/workers/{worker_id}", timeout=5)
    assert api.status_code == 200 and api.json()["status"] == "draining", api.text

    page.goto(gateway.url + "/admin/administration/worker/?status__exact=draining")
    expect(row_of(page, worker_url).locator("td.field-status_badge")).to_have_text("Draining")
    shot("list-draining")

    # Remove it from the detail page (confirmed in a dialog); a draining worker goes at once.
    page.goto(gateway.url + href)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Remove").click()
    expect(page).to_have_url(re.compile(r"/admin/administration/worker/$"))
    expect(page.locator("ul.messagelist")).to_contain_text(f"Removal of {worker_url} queued")
    deadline = time.monotonic() + 15
    while row_of(page, worker_url).count():
        assert time.monotonic() < deadline, f"never removed:\n{gateway.log()}"
        time.sleep(0.3)
        page.reload()
    shot("list-removed")
    assert httpx.get(f"{gateway.url}/workers/{worker_id}", timeout=5).status_code == 404
    assert len(shot.taken) == 10 and all(path.stat().st_size > 10_000 for path in shot.taken)


def test_gateway_serves_the_admin_static_files(console_gateway: Process) -> None:
    response = httpx.get(console_gateway.url + STYLESHEET, timeout=5)
    assert response.status_code == 200 and "text/css" in response.headers["content-type"]

"""What the console's browser tests share: Debian's Chromium driven by Playwright, and a staff user
made in a running gateway's database with `manage.py ensure_admin`."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.e2e.conftest import ROOT, Process

__all__ = ["CHROMIUM", "USERNAME", "PASSWORD", "needs_chromium", "browser", "make_staff_user"]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
USERNAME = "console-admin"
PASSWORD = "e2e-Console-passw0rd"

needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (CI installs Debian's chromium in .ci/run)"
)


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def make_staff_user(gateway: Process) -> None:
    """A staff superuser (USERNAME, PASSWORD) in ``gateway``'s database."""
    env = {**gateway.env, "GW_ADMIN_USERNAME": USERNAME, "GW_ADMIN_PASSWORD": PASSWORD}
    done = subprocess.run(
        [sys.executable, "manage.py", "ensure_admin"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr

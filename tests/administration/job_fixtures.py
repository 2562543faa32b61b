"""Fixtures shared by the registration-job tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from administration.jobs import wait_for_local_jobs
from common.config import GatewayConfig, install_config


@pytest.fixture(autouse=True)
def jobs_end_at_once() -> Iterator[None]:
    """A job a test's POST queues (on a job thread) gives up at once (nothing listens at its URL) and
    is waited for; autouse in every module that imports it."""
    install_config(GatewayConfig(worker_startup_timeout_secs=0.1, worker_startup_check_interval=0.1), export=False)
    yield
    wait_for_local_jobs()
    install_config(GatewayConfig(), export=False)

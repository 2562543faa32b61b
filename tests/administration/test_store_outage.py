"""While the store is known to be down, control routes that need it answer 503 at once in their
family's envelope (no wait for the pool), one request a second checks the store and goes through
when it answers, and routes that work from the snapshot are left alone. The real outage, Postgres
cut under traffic, is tests/e2e/test_service_outages.py."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
from django.db import OperationalError
from django.test import Client

from common.outages import STORE

pytestmark = pytest.mark.django_db


@pytest.fixture
def store_down() -> Iterator[None]:
    STORE.failed(OperationalError("couldn't get a connection after 3.00 sec"))
    yield
    STORE.recovered()


def test_routes_that_need_the_store_are_refused_at_once(client: Client, store_down: None) -> None:
    started = time.monotonic()
    listing = client.get("/workers")
    page = client.get("/admin/login/")
    assert time.monotonic() - started < 1.0  # no wait for a pooled connection
    assert listing.status_code == 503 and listing["Retry-After"] == "5"
    assert listing.json() == {"error": "The gateway's store is unavailable; try again shortly",
                              "code": "SERVICE_UNAVAILABLE"}
    assert page.status_code == 503 and page["Content-Type"].startswith("text/plain")
    loads = client.get("/get_loads")  # the snapshot's route: untouched
    assert loads.status_code == 200


def test_one_request_a_second_checks_the_store_and_goes_through(client: Client, store_down: None) -> None:
    assert client.get("/workers").status_code == 503
    time.sleep(STORE.retry_secs + 0.05)
    listing = client.get("/workers")  # this one checks the store (up), which ends the outage
    assert listing.status_code == 200, listing.content
    assert not STORE.down

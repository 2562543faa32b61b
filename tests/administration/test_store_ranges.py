"""Numbers are checked against what the store can hold: an integer past its column's range is the
spec's 422 (like a wrong type) on POST, PUT and PATCH /workers, and a form error in the console, never
an OverflowError (SQLite) or a DataError (Postgres) answered 500. The range is the model column's, the
same on every store."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import models
from django.test import Client

from administration.models import TenantRateLimit, Worker
from administration.store_ranges import column_range
from administration.worker_spec import parse_worker_spec, spec_schema

pytestmark = pytest.mark.django_db

LOW, HIGH = column_range(Worker._meta.get_field("priority"))
UNSIGNED_HIGH = column_range(models.PositiveIntegerField())[1]
DESERIALIZE = "Failed to deserialize the JSON body into the target type"

PAST_THE_STORE = [
    pytest.param({"priority": HIGH + 1}, "priority", id="priority-above"),
    pytest.param({"priority": LOW - 1}, "priority", id="priority-below"),
    pytest.param({"priority": 2**63}, "priority", id="priority-past-sqlite"),
    pytest.param({"priority": 2**64 - 1}, "priority", id="priority-u64"),
    pytest.param({"health": {"timeout_secs": UNSIGNED_HIGH + 1}}, "health.timeout_secs", id="health"),
    pytest.param({"dp_size": 2**63}, "dp_size", id="dp_size"),
    pytest.param({"bootstrap_port": UNSIGNED_HIGH + 1}, "bootstrap_port", id="bootstrap_port"),
    pytest.param({"resilience": {"retryable_status_codes": [500, 2**40]}}, "resilience.retryable_status_codes[1]",
                 id="status-codes"),
    pytest.param({"models": [{"id": "m", "context_length": 2**63}]}, "models[0].context_length", id="card"),
]


def test_the_range_is_the_columns_on_every_store() -> None:
    assert (LOW, HIGH) == (-(2**31), 2**31 - 1)
    assert spec_schema()["properties"]["priority"] == {"type": "integer", "minimum": LOW, "maximum": HIGH}


@pytest.mark.parametrize(("change", "field"), PAST_THE_STORE)
def test_post_past_the_store_is_422(client: Client, change: dict[str, Any], field: str) -> None:
    answer = client.post("/workers", {"url": "http://range:1", **change}, content_type="application/json")
    assert answer.status_code == 422 and answer["Content-Type"].startswith("text/plain")
    assert answer.content.decode().startswith(f"{DESERIALIZE}: {field}: invalid value")
    assert not Worker.objects.exists()


@pytest.mark.parametrize("method", ["put", "patch"])
@pytest.mark.parametrize(("change", "field"), PAST_THE_STORE[:4])
def test_put_and_patch_past_the_store_are_422(client: Client, method: str, change: dict[str, Any], field: str) -> None:
    worker = Worker.objects.create(url="http://range:1", registered=True, priority=7)
    answer = getattr(client, method)(
        f"/workers/{worker.pk}", {"url": worker.url, **change}, content_type="application/json"
    )
    assert answer.status_code == 422 and answer.content.decode().startswith(f"{DESERIALIZE}: {field}")
    worker.refresh_from_db()
    assert worker.priority == 7


@pytest.mark.parametrize("priority", [LOW, HIGH])
def test_the_ends_of_the_range_are_stored(client: Client, priority: int) -> None:
    answer = client.post("/workers", {"url": "http://range:1", "priority": priority}, content_type="application/json")
    assert answer.status_code == 202
    assert Worker.objects.get().priority == priority
    assert parse_worker_spec({"url": "http://x:1", "health": {"timeout_secs": UNSIGNED_HIGH}}).health == {
        "timeout_secs": UNSIGNED_HIGH
    }


@pytest.mark.parametrize(
    ("priority", "error"),
    [
        (str(HIGH + 1), f"Ensure this value is less than or equal to {HIGH}."),
        (str(2**70), f"Ensure this value is less than or equal to {HIGH}."),
        (str(LOW - 1), f"Ensure this value is greater than or equal to {LOW}."),
    ],
)
def test_the_console_form_refuses_a_priority_past_the_store(admin_client: Client, priority: str, error: str) -> None:
    form = {"url": "http://10.0.0.9:8000", "model_id": "", "runtime_type": "unspecified", "worker_type": "regular",
            "api_key": "", "labels": "", "priority": priority, "cost": "1.0"}
    answer = admin_client.post("/admin/administration/worker/add/", form)
    assert answer.status_code == 200 and error in answer.content.decode()
    assert not Worker.objects.exists()


def test_the_console_form_refuses_an_infinite_cost(admin_client: Client) -> None:
    form = {"url": "http://10.0.0.9:8000", "model_id": "", "runtime_type": "unspecified", "worker_type": "regular",
            "api_key": "", "labels": "", "priority": "1", "cost": "1e999"}
    answer = admin_client.post("/admin/administration/worker/add/", form)
    assert answer.status_code == 200 and "Please correct the error below." in answer.content.decode()
    assert not Worker.objects.exists()


@pytest.mark.parametrize("limit", [str(2**63), str(2**70), "-1"])
def test_the_console_refuses_a_tenant_limit_past_its_column(admin_client: Client, limit: str) -> None:
    answer = admin_client.post("/admin/administration/tenantratelimit/add/",
                               {"tenant_id": "acme", "requests_per_minute": limit})
    assert answer.status_code == 200 and "Please correct the error below." in answer.content.decode()
    assert not TenantRateLimit.objects.exists()

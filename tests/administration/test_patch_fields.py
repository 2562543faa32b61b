"""PATCH /workers/{id} changes only what spec 3 lets it change (priority, cost, labels merged,
api_key, health merged); every other field of its body (url, overload, http_pool, resilience,
models, worker_type, ...) is ignored, neither typed nor applied: PUT replaces those."""

from __future__ import annotations

from typing import AsyncIterator

import pytest
from django.test import AsyncClient

from administration.models import Worker
from administration.registry_sync import RegistrySync
from tests.administration.test_workers_api import FAST, register
from tests.administration.fleet import running_fleet
from tests.conftest import until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def fleet() -> AsyncIterator[RegistrySync]:
    async with running_fleet(FAST) as running:
        yield running


async def test_patch_applies_its_fields_and_ignores_every_other(fleet, worker) -> None:
    api = AsyncClient()
    got = await register(api, {"url": worker.url, "labels": {"zone": "a"}, "health": {"timeout_secs": 7}})
    before = await Worker.objects.aget(pk=got["id"])
    body = {
        "priority": 11,
        "cost": 1.5,
        "labels": {"rack": "2"},
        "api_key": "sk-rotated",
        "health": {"failure_threshold": 9},
        # ignored (spec 3: "Other fields ... are ignored; use PUT"), however they are spelled:
        "url": "http://elsewhere:1",
        "overload": {"waiting_requests": 5},
        "http_pool": {"max_connections": 3},
        "resilience": "not even an object",
        "models": [{"id": "other-model"}],
        "worker_type": "decode",
        "dp_size": 4,
    }
    response = await api.patch(f"/workers/{got['id']}", body, content_type="application/json")
    assert response.status_code == 202, response.content

    async def applied() -> bool:
        return (await api.get(f"/workers/{got['id']}")).json()["priority"] == 11

    await until(applied)
    after = await Worker.objects.aget(pk=got["id"])
    assert (after.cost, after.api_key) == (1.5, "sk-rotated")
    assert after.labels == {**before.labels, "rack": "2"}
    assert after.settings["health"] == {**before.settings.get("health", {}), "failure_threshold": 9}
    assert after.url == before.url and after.worker_type == before.worker_type
    assert after.model_cards == before.model_cards and after.model_id == before.model_id
    for block in ("overload", "http_pool", "resilience", "dp_size"):
        assert after.settings.get(block) == before.settings.get(block)


async def test_patch_of_only_ignored_fields_changes_nothing(fleet, worker) -> None:
    api = AsyncClient()
    got = await register(api, {"url": worker.url})
    before = await Worker.objects.aget(pk=got["id"])
    response = await api.patch(
        f"/workers/{got['id']}", {"url": "http://elsewhere:1", "overload": {"waiting_requests": 0}}, content_type="application/json"
    )
    assert response.status_code == 202, response.content

    async def done() -> bool:
        return "job_status" not in (await api.get(f"/workers/{got['id']}")).json()

    await until(done)
    after = await Worker.objects.aget(pk=got["id"])
    assert after.url == before.url and after.settings == before.settings and after.priority == before.priority


async def test_patch_still_types_and_checks_its_own_fields(fleet, worker) -> None:
    api = AsyncClient()
    got = await register(api, {"url": worker.url})
    wrong_type = await api.patch(f"/workers/{got['id']}", {"priority": "high"}, content_type="application/json")
    assert wrong_type.status_code == 422
    refused = await api.patch(f"/workers/{got['id']}", {"health": {"timeout_secs": -1}}, content_type="application/json")
    assert refused.status_code == 422
    after = await Worker.objects.aget(pk=got["id"])
    assert after.priority == 50 and "job_status" not in (await api.get(f"/workers/{got['id']}")).json()

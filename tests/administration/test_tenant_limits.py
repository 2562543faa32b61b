"""Per-tenant rate limits stored in the admin console: the model's validation, the console pages, and
a running fleet installing added, changed and deleted rows into the limiter the relay enforces (a
real mock worker behind the in-process gateway)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import AsyncClient, Client

from administration import registry_sync as fleet_module
from common.db import arun_db
from administration.notices import record_change
from administration.registry_sync import RegistrySync
from administration.models import TenantRateLimit, Worker, WorkerSource, WorkerStatus
from administration.tenant_limits import stored_tenant_limits
from common.config import GatewayConfig, current_config, install_config
from inference.dataplane import data_plane
from tests.conftest import Actor, RunningWorker, until

LIST = "/admin/administration/tenantratelimit/"
ADD = f"{LIST}add/"
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
PRECEDENCE = "--default-tenant-rate-limit still applies to tenants with neither a row nor a flag"


def new_actor() -> Actor:
    """A tenant of its own per test, so counters shared through Redis never meet another run's."""
    return Actor(f"tenant-{uuid.uuid4().hex[:10]}", f"sk-{uuid.uuid4().hex}")


async def limit_becomes(tenant_id: str, expected: int, within: float = 10.0) -> None:
    """The fleet installs stored limits a moment after the write (an async refresh)."""

    async def reached() -> bool:
        return data_plane().tenant_limits.limit_for(tenant_id) == expected

    await until(reached, timeout=within)


async def clear_of_window_edge(margin: float = 10.0) -> None:
    """Start a burst early in a minute window, so its counts all land in one window."""
    left = 60.0 - time.time() % 60.0
    if left < margin:
        await asyncio.sleep(left + 0.05)


async def chat(gateway: httpx.AsyncClient, actor: Actor) -> httpx.Response:
    return await gateway.post("/v1/chat/completions", json=CHAT, headers=actor.headers)


ServedFactory = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def start_served(make_gateway, worker: RunningWorker, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ServedFactory]:
    """The gateway in-process with a running fleet over the store, which holds one ready worker (the
    mock worker). ``refresh_secs`` sets the fleet's safety-net refresh."""
    fleets: list[RegistrySync] = []

    async def start(refresh_secs: float, **config: Any) -> httpx.AsyncClient:
        monkeypatch.setattr(fleet_module, "FULL_RELOAD_SECS", refresh_secs)
        await Worker.objects.acreate(
            url=worker.url, model_id=worker.model, runtime_type="sglang", status=WorkerStatus.READY,
            registered=True, source=WorkerSource.API,
        )
        gateway = make_gateway([], disable_health_check=True, **config)
        fleet = RegistrySync(current_config())
        fleets.append(fleet)
        await fleet.astart()
        return gateway

    yield start
    for fleet in fleets:
        await fleet.astop()


# --- the model -----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("tenant_id", ["", "   ", "two words", "acme:key", "acme=5"])
def test_tenant_id_must_be_one_plain_token(tenant_id: str) -> None:
    with pytest.raises(ValidationError) as raised:
        TenantRateLimit(tenant_id=tenant_id, requests_per_minute=5).full_clean()
    assert set(raised.value.message_dict) == {"tenant_id"}


@pytest.mark.django_db
@pytest.mark.parametrize("value", [-1, "ten", "2.5", None])
def test_limit_must_be_a_non_negative_whole_number(value: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        TenantRateLimit(tenant_id="acme", requests_per_minute=value).full_clean()
    assert set(raised.value.message_dict) == {"requests_per_minute"}


@pytest.mark.django_db
def test_the_store_refuses_a_negative_limit_and_a_second_row_for_a_tenant() -> None:
    TenantRateLimit(tenant_id="acme", requests_per_minute=0).full_clean()  # 0: unlimited, allowed
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantRateLimit.objects.create(tenant_id="acme", requests_per_minute=-1)  # the CHECK constraint
    TenantRateLimit.objects.create(tenant_id="acme", requests_per_minute=3)
    with pytest.raises(ValidationError):
        TenantRateLimit(tenant_id="acme", requests_per_minute=4).full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantRateLimit.objects.create(tenant_id="acme", requests_per_minute=4)
    assert stored_tenant_limits() == {"acme": 3}
    assert str(TenantRateLimit(tenant_id="x", requests_per_minute=0)) == "x: unlimited req/min"


# --- the console pages ---------------------------------------------------------------------------


@pytest.fixture
def flags() -> Iterator[GatewayConfig]:
    config = GatewayConfig(default_tenant_rate_limit=10, tenant_rate_limits=(("acme", "3"),))
    install_config(config, export=False)
    yield config
    install_config(GatewayConfig(), export=False)


@pytest.mark.django_db
def test_console_lists_rows_with_what_the_flags_alone_would_give(admin_client: Client, flags: GatewayConfig) -> None:
    TenantRateLimit.objects.create(tenant_id="acme", requests_per_minute=50)
    TenantRateLimit.objects.create(tenant_id="globex", requests_per_minute=0)
    page = admin_client.get(LIST)
    assert page.status_code == 200
    rows = [(r.tenant_id, r.requests_per_minute) for r in page.context["cl"].result_list]
    assert rows == [("acme", 50), ("globex", 0)]
    html = page.content.decode()
    assert PRECEDENCE in html
    admin = page.context["cl"].model_admin
    assert [admin.limit_column(r) for r in page.context["cl"].result_list] == ["50", "unlimited"]
    assert [admin.flag_column(r) for r in page.context["cl"].result_list] == ["3", "10"]
    assert Client().get(LIST)["Location"].startswith("/admin/login/")  # staff only


@pytest.mark.django_db
def test_console_add_form_explains_precedence_and_refuses_bad_input(admin_client: Client) -> None:
    assert PRECEDENCE in admin_client.get(ADD).content.decode()
    TenantRateLimit.objects.create(tenant_id="taken", requests_per_minute=1)
    refused = [
        ({"tenant_id": "", "requests_per_minute": "5"}, "tenant_id"),
        ({"tenant_id": "two words", "requests_per_minute": "5"}, "tenant_id"),
        ({"tenant_id": "taken", "requests_per_minute": "5"}, "tenant_id"),
        ({"tenant_id": "acme", "requests_per_minute": "-1"}, "requests_per_minute"),
        ({"tenant_id": "acme", "requests_per_minute": "ten"}, "requests_per_minute"),
        ({"tenant_id": "acme", "requests_per_minute": "2.5"}, "requests_per_minute"),
        ({"tenant_id": "acme", "requests_per_minute": ""}, "requests_per_minute"),
    ]
    for body, field in refused:
        response = admin_client.post(ADD, body)
        assert response.status_code == 200, body
        assert list(response.context["adminform"].form.errors) == [field], body
    assert stored_tenant_limits() == {"taken": 1}
    added = admin_client.post(ADD, {"tenant_id": " acme ", "requests_per_minute": "0"})
    assert added.status_code == 302
    assert stored_tenant_limits() == {"taken": 1, "acme": 0}  # stripped; 0 stored as unlimited


# --- a running fleet installs rows into the relay's limiter ----------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_console_add_change_and_delete_reach_the_relay(start_served: ServedFactory, admin_user: User) -> None:
    actor = new_actor()
    # The safety-net refresh is an hour away: only the notice a console save publishes brings a change in.
    gateway = await start_served(refresh_secs=3600, tenant_api_keys=((actor.tenant_id, actor.key),))
    before = await chat(gateway, actor)
    assert before.status_code == 200 and "x-ratelimit-limit" not in before.headers
    assert data_plane().rate_limiter is None

    console = AsyncClient()
    await console.aforce_login(admin_user)
    added = await console.post(ADD, {"tenant_id": actor.tenant_id, "requests_per_minute": "2"})
    assert added.status_code == 302, added.content
    await limit_becomes(actor.tenant_id, 2)
    await clear_of_window_edge()
    burst = [await chat(gateway, actor) for _ in range(3)]
    assert [r.status_code for r in burst] == [200, 200, 429]
    assert [r.headers["x-ratelimit-remaining"] for r in burst] == ["1", "0", "0"]
    assert {r.headers["x-ratelimit-limit"] for r in burst} == {"2"}
    assert burst[2].headers["x-gw-error-code"] == "rate_limit_exceeded" and "retry-after" in burst[2].headers

    row = await TenantRateLimit.objects.aget(tenant_id=actor.tenant_id)
    changed = await console.post(f"{LIST}{row.pk}/change/", {"tenant_id": actor.tenant_id, "requests_per_minute": "5"})
    assert changed.status_code == 302, changed.content
    await limit_becomes(actor.tenant_id, 5)
    raised = await chat(gateway, actor)
    assert raised.status_code == 200 and raised.headers["x-ratelimit-limit"] == "5"
    # The minute's count carried on: 3 counted before, this is the 4th.
    same_window = raised.headers["x-ratelimit-reset"] == burst[0].headers["x-ratelimit-reset"]
    assert raised.headers["x-ratelimit-remaining"] == ("1" if same_window else "4")

    deleted = await console.post(f"{LIST}{row.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302, deleted.content
    await limit_becomes(actor.tenant_id, 0)
    assert data_plane().rate_limiter is None  # no limit anywhere: the relay's fast None check again
    after = await chat(gateway, actor)
    assert after.status_code == 200 and "x-ratelimit-limit" not in after.headers


@pytest.mark.django_db(transaction=True)
async def test_fleet_refresh_installs_rows_written_without_a_notice(start_served: ServedFactory) -> None:
    actor, other = new_actor(), new_actor()
    gateway = await start_served(
        refresh_secs=0.05,
        tenant_api_keys=((actor.tenant_id, actor.key), (other.tenant_id, other.key)),
        default_tenant_rate_limit=100,
        tenant_rate_limits=((actor.tenant_id, "50"),),
    )
    assert data_plane().tenant_limits.limit_for(actor.tenant_id) == 50  # the flag, before any row

    await TenantRateLimit.objects.acreate(tenant_id=actor.tenant_id, requests_per_minute=1)  # no notice
    await limit_becomes(actor.tenant_id, 1)  # the row overrides the flag
    await clear_of_window_edge()
    first, second = await chat(gateway, actor), await chat(gateway, actor)
    assert (first.status_code, second.status_code) == (200, 429)
    assert first.headers["x-ratelimit-limit"] == second.headers["x-ratelimit-limit"] == "1"

    await TenantRateLimit.objects.filter(tenant_id=actor.tenant_id).aupdate(requests_per_minute=0)
    await limit_becomes(actor.tenant_id, 0)  # a stored 0: unlimited, despite the default and the flag
    exempt = await chat(gateway, actor)
    assert exempt.status_code == 200 and "x-ratelimit-limit" not in exempt.headers
    counted = await chat(gateway, other)  # the default still counts every other tenant
    assert counted.status_code == 200 and counted.headers["x-ratelimit-limit"] == "100"

    await TenantRateLimit.objects.filter(tenant_id=actor.tenant_id).adelete()
    await limit_becomes(actor.tenant_id, 50)  # back to its flag
    back = await chat(gateway, actor)
    assert back.headers["x-ratelimit-limit"] == "50"


@pytest.mark.django_db(transaction=True)
async def test_a_change_counted_in_the_store_reaches_the_process_within_a_second(
    start_served: ServedFactory,
) -> None:
    """Another process (a command, a Celery job, another serving process) wrote a row and counted the
    change in the store's registry version: this process's version poll picks it up, long before the
    safety-net refresh."""
    actor = new_actor()
    await start_served(refresh_secs=60, tenant_api_keys=((actor.tenant_id, actor.key),))
    await TenantRateLimit.objects.acreate(tenant_id=actor.tenant_id, requests_per_minute=3)
    await asyncio.sleep(0.8)
    assert data_plane().tenant_limits.limit_for(actor.tenant_id) == 0  # no notice: not seen yet
    await arun_db(record_change)
    await limit_becomes(actor.tenant_id, 3, within=1.5)

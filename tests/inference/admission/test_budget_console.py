"""Token budgets stored in the admin console (TenantBudget rows): the model's validation, the console
pages, and a running fleet installing a row over the tenant's --tenant-budget flag (and back when it is
deleted), which the relay then enforces (a real mock worker behind the in-process gateway)."""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import Client

from administration import registry_sync as fleet_module
from administration.models import TenantBudget, Worker, WorkerSource, WorkerStatus
from administration.registry_sync import RegistrySync
from administration.tenant_budgets import stored_tenant_budgets
from common.config import GatewayConfig, current_config, install_config
from inference.accounting import AccountingEntry, Outcome, TokenUsage
from inference.admission.budgets import Budget
from inference.dataplane import data_plane
from tests.conftest import Actor, RunningWorker, until

LIST = "/admin/administration/tenantbudget/"
ADD = f"{LIST}add/"
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
PRECEDENCE = "--default-tenant-budget still applies to tenants with neither a row nor a flag"


def new_actor() -> Actor:
    """A tenant of its own per test, so counters shared through Redis never meet another run's."""
    return Actor(f"tenant-{uuid.uuid4().hex[:10]}", f"sk-{uuid.uuid4().hex}")


def used(tenant: str, tokens: int) -> AccountingEntry:
    return AccountingEntry(
        at=time.time(), request_id=uuid.uuid4().hex, tenant=tenant, model="mock-model", worker="", surface="chat",
        route="/v1/chat/completions", status=200, outcome=Outcome.SUCCESS, usage=TokenUsage(tokens, 0),
    )


# --- the model -----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("tenant_id", ["", "   ", "two words", "acme:key", "acme=5"])
def test_tenant_id_must_be_one_plain_token(tenant_id: str) -> None:
    with pytest.raises(ValidationError) as raised:
        TenantBudget(tenant_id=tenant_id, tokens=5, period="day").full_clean()
    assert set(raised.value.message_dict) == {"tenant_id"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "tokens, period, field",
    [(-1, "day", "tokens"), ("ten", "day", "tokens"), ("2.5", "day", "tokens"), (None, "day", "tokens"),
     (5, "week", "period"), (5, "", "period")],
)
def test_budget_must_be_whole_tokens_per_day_or_month(tokens: Any, period: str, field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        TenantBudget(tenant_id="acme", tokens=tokens, period=period).full_clean()
    assert set(raised.value.message_dict) == {field}


@pytest.mark.django_db
def test_the_store_refuses_a_negative_budget_and_a_second_row_for_a_tenant() -> None:
    TenantBudget(tenant_id="acme", tokens=0, period="month").full_clean()  # 0: unlimited, allowed
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantBudget.objects.create(tenant_id="acme", tokens=-1, period="day")  # the CHECK constraint
    TenantBudget.objects.create(tenant_id="acme", tokens=3000, period="month")
    with pytest.raises(ValidationError):
        TenantBudget(tenant_id="acme", tokens=4, period="day").full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantBudget.objects.create(tenant_id="acme", tokens=4, period="day")
    assert stored_tenant_budgets() == {"acme": "3000/month"}
    TenantBudget.objects.create(tenant_id="globex", tokens=5, period="week")  # written around the console
    assert stored_tenant_budgets() == {"acme": "3000/month"}  # left out (logged), never a broken fleet loop


# --- the console pages ---------------------------------------------------------------------------


@pytest.fixture
def flags() -> Iterator[GatewayConfig]:
    config = GatewayConfig(default_tenant_budget="100000/month", tenant_budgets=(("acme", "3000/day"),))
    install_config(config, export=False)
    yield config
    install_config(GatewayConfig(), export=False)


@pytest.mark.django_db
def test_console_lists_rows_with_what_the_flags_alone_would_give(admin_client: Client, flags: GatewayConfig) -> None:
    TenantBudget.objects.create(tenant_id="acme", tokens=50000, period="month")
    TenantBudget.objects.create(tenant_id="globex", tokens=0, period="day")
    page = admin_client.get(LIST)
    assert page.status_code == 200
    rows = [(r.tenant_id, r.tokens, r.period) for r in page.context["cl"].result_list]
    assert rows == [("acme", 50000, "month"), ("globex", 0, "day")]
    assert PRECEDENCE in page.content.decode()
    admin = page.context["cl"].model_admin
    assert [admin.budget_column(r) for r in page.context["cl"].result_list] == ["50,000 tokens/month", "unlimited"]
    assert [admin.flag_column(r) for r in page.context["cl"].result_list] == ["3,000 tokens/day", "100,000 tokens/month"]
    assert Client().get(LIST)["Location"].startswith("/admin/login/")  # staff only


@pytest.mark.django_db
def test_console_add_form_explains_precedence_and_refuses_bad_input(admin_client: Client) -> None:
    assert PRECEDENCE in admin_client.get(ADD).content.decode()
    TenantBudget.objects.create(tenant_id="taken", tokens=1, period="day")
    refused = [
        ({"tenant_id": "", "tokens": "5", "period": "day"}, "tenant_id"),
        ({"tenant_id": "two words", "tokens": "5", "period": "day"}, "tenant_id"),
        ({"tenant_id": "taken", "tokens": "5", "period": "day"}, "tenant_id"),
        ({"tenant_id": "acme", "tokens": "-1", "period": "day"}, "tokens"),
        ({"tenant_id": "acme", "tokens": "ten", "period": "day"}, "tokens"),
        ({"tenant_id": "acme", "tokens": "", "period": "day"}, "tokens"),
        ({"tenant_id": "acme", "tokens": str(2**63), "period": "day"}, "tokens"),  # past the column
        ({"tenant_id": "acme", "tokens": "5", "period": "week"}, "period"),
    ]
    for body, field in refused:
        response = admin_client.post(ADD, body)
        assert response.status_code == 200, body
        assert list(response.context["adminform"].form.errors) == [field], body
    assert stored_tenant_budgets() == {"taken": "1/day"}
    added = admin_client.post(ADD, {"tenant_id": " acme ", "tokens": "250000", "period": "month"})
    assert added.status_code == 302
    assert stored_tenant_budgets() == {"taken": "1/day", "acme": "250000/month"}  # stripped


# --- a running fleet installs rows over the flags --------------------------------------------------


ServedFactory = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def start_served(make_gateway: Any, worker: RunningWorker, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ServedFactory]:
    """The gateway in-process with a running fleet over the store, which holds one ready worker."""
    fleets: list[RegistrySync] = []

    async def start(refresh_secs: float, **config: Any) -> httpx.AsyncClient:
        monkeypatch.setattr(fleet_module, "FULL_RELOAD_SECS", refresh_secs)
        await Worker.objects.acreate(
            url=worker.url, model_id=worker.model, runtime_type="sglang", status=WorkerStatus.READY,
            registered=True, source=WorkerSource.API,
        )
        gateway: httpx.AsyncClient = make_gateway([], disable_health_check=True, **config)
        fleet = RegistrySync(current_config())
        fleets.append(fleet)
        await fleet.astart()
        return gateway

    yield start
    for fleet in fleets:
        await fleet.astop()


async def budget_becomes(tenant_id: str, expected: Budget | None, within: float = 10.0) -> None:
    async def reached() -> bool:
        return data_plane().tenant_budgets.budget_for(tenant_id) == expected

    await until(reached, timeout=within)


@pytest.mark.django_db(transaction=True)
async def test_a_console_row_overrides_the_flag_until_it_is_deleted(start_served: ServedFactory) -> None:
    actor = new_actor()
    gateway = await start_served(
        refresh_secs=0.05, tenant_api_keys=((actor.tenant_id, actor.key),), tenant_budgets=((actor.tenant_id, "1000/day"),),
    )
    assert data_plane().tenant_budgets.budget_for(actor.tenant_id) == Budget(1000, "day")  # the flag
    data_plane().account(used(actor.tenant_id, 400))
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=actor.headers)).status_code == 200

    await TenantBudget.objects.acreate(tenant_id=actor.tenant_id, tokens=300, period="day")
    await budget_becomes(actor.tenant_id, Budget(300, "day"))  # the row wins: 400 used of 300
    refused = await gateway.post("/v1/chat/completions", json=CHAT, headers=actor.headers)
    assert refused.status_code == 429 and refused.headers["x-gw-error-code"] == "budget_exceeded"

    await TenantBudget.objects.filter(tenant_id=actor.tenant_id).aupdate(tokens=0)
    await budget_becomes(actor.tenant_id, None)  # a stored 0: unlimited despite the flag
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=actor.headers)).status_code == 200

    await TenantBudget.objects.filter(tenant_id=actor.tenant_id).adelete()
    await budget_becomes(actor.tenant_id, Budget(1000, "day"))  # back to its flag, the day's use still counted
    counter = data_plane().budgets
    assert counter is not None and (counter.used(actor.tenant_id) or 0) >= 400  # plus what the requests used
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=actor.headers)).status_code == 200

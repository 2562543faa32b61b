"""The console's usage side (issue 25, item 6): the usage page (charts' data, top tenants and models,
budgets with what is left, prices, the newest requests, the usage table), the CSV exports of the usage
table and of the request log, the read-only request log with its filters and request id search, and
no 500 for any query parameter."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Iterator

import pytest
from django.contrib.auth.models import Permission, User
from django.http import StreamingHttpResponse
from django.test import Client
from django.utils import timezone

from administration.models import BudgetPeriod, ModelPrice, RequestLogEntry, TenantBudget, UsageMinute
from administration.usage_page import CHART_SERIES
from common.config import GatewayConfig, install_config

pytestmark = pytest.mark.django_db

PAGE = "/admin/administration/usageminute/usage/"
USAGE_CSV = "/admin/administration/usageminute/usage/export.csv"
LOG = "/admin/administration/requestlogentry/"
LOG_CSV = "/admin/administration/requestlogentry/export.csv"


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


@pytest.fixture
def today() -> datetime:
    return timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def flags() -> Iterator[None]:
    install_config(GatewayConfig(tenant_budgets=(("bob", "1000/month"),), default_tenant_budget="500/day"), export=False)
    yield
    install_config(GatewayConfig(), export=False)


@pytest.fixture
def recorded(today: datetime) -> None:
    UsageMinute.objects.create(tenant="alice", model="llama", minute=today + timedelta(minutes=5), requests=3,
                               errors=1, prompt_tokens=300, completion_tokens=100)
    UsageMinute.objects.create(tenant="bob", model="qwen", minute=today + timedelta(minutes=6), requests=1,
                               prompt_tokens=50, completion_tokens=20)
    UsageMinute.objects.create(tenant="carol", model="llama", minute=today - timedelta(days=2), requests=2,
                               prompt_tokens=1000, completion_tokens=1000)
    ModelPrice.objects.create(model="llama", effective_from=today - timedelta(days=30), input_per_million=Decimal(1),
                              cached_input_per_million=Decimal(1), output_per_million=Decimal(2))
    TenantBudget.objects.create(tenant_id="alice", tokens=1000, period=BudgetPeriod.DAY)
    for index, (tenant, status) in enumerate((("alice", 200), ("alice", 500), ("bob", 429))):
        RequestLogEntry.objects.create(
            at=today + timedelta(minutes=5, seconds=index), request_id=f"req-{index}", tenant=tenant, model="llama",
            worker="http://w", surface="chat", route="/v1/chat/completions", status=status,
            outcome="success" if status == 200 else "upstream_error", latency_ms=10.0, prompt_tokens=5,
        )  # fmt: skip


def content(response: Any) -> bytes:
    if isinstance(response, StreamingHttpResponse):
        return b"".join(response.streaming_content)  # type: ignore[arg-type]
    return bytes(response.content)


def test_the_usage_page_shows_charts_tops_budgets_prices_and_requests(
    staff: Client, flags: None, recorded: None, today: datetime
) -> None:
    UsageMinute.objects.create(tenant="dave", model="llama", minute=today, requests=1, prompt_tokens=700)
    page = staff.get(PAGE)
    assert page.status_code == 200
    context = page.context
    assert context["error"] is None
    charts = context["charts"]
    tenants = {series["label"]: series for series in charts["tenant_tokens"]["series"]}
    assert len(charts["tenant_tokens"]["days"]) == 30 and charts["tenant_tokens"]["days"][-1] == today.date().isoformat()
    assert tenants["alice"]["total"] == 400 and tenants["alice"]["values"][-1] == 400
    assert tenants["carol"]["values"][-3] == 2000
    assert {series["label"] for series in charts["model_spend"]["series"]} == {"llama", "qwen"}
    assert [row["name"] for row in context["top_tenants"]] == ["carol", "dave", "alice", "bob"]
    assert [row["name"] for row in context["top_models"]] == ["llama", "qwen"]
    assert context["totals"]["requests"] == 7 and context["totals"]["tokens"] == 3170
    assert context["unpriced_models"] == ["qwen"]
    budgets = {budget.tenant: budget for budget in context["budgets"]}
    assert (budgets["alice"].source, budgets["alice"].used, budgets["alice"].left) == ("console", 400, 600)
    assert (budgets["bob"].source, budgets["bob"].period, budgets["bob"].used) == ("flag", "month", 70)
    # --default-tenant-budget: every tenant that used tokens today with no budget of its own.
    assert (budgets["dave"].source, budgets["dave"].tokens, budgets["dave"].used, budgets["dave"].left) == (
        "default", 500, 700, 0)
    assert "carol" not in budgets  # nothing used in the current period
    assert [price["model"] for price in context["prices"]] == ["llama"]
    assert [entry.request_id for entry in context["recent"]] == ["req-2", "req-1", "req-0"]
    html = page.content.decode()
    assert 'id="gw-usage-charts"' in html and "administration/usage.js" in html and "No price for qwen" in html
    data = json.loads(html.split('id="gw-usage-charts" type="application/json">')[1].split("</script>")[0])
    assert data["tenant_tokens"]["series"][0]["label"] == "carol"


def test_filters_narrow_the_page_and_its_export(staff: Client, recorded: None, today: datetime) -> None:
    day = today.date().isoformat()
    page = staff.get(PAGE, {"start": day, "end": day, "tenant": "alice"})
    assert [row["tenant"] for row in page.context["table"]] == ["alice"]
    assert page.context["export_url"].endswith(f"?start={day}&end={day}&tenant=alice")
    exported = staff.get(page.context["export_url"])
    assert exported.status_code == 200 and exported["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(content(exported).decode())))
    assert rows[0] == ["tenant", "model", "day", "requests", "errors", "prompt_tokens", "completion_tokens",
                       "cached_tokens", "spend"]
    assert rows[1:] == [["alice", "llama", day, "3", "1", "300", "100", "0", "0.0005"]]
    assert staff.get(USAGE_CSV, {"start": "bad"}).status_code == 400


def test_many_tenants_fold_into_other(staff: Client, today: datetime) -> None:
    for index in range(CHART_SERIES + 3):
        UsageMinute.objects.create(tenant=f"t{index:02}", model="m", minute=today, requests=1, prompt_tokens=index + 1)
    series = staff.get(PAGE).context["charts"]["tenant_tokens"]["series"]
    assert len(series) == CHART_SERIES + 1 and series[-1]["label"] == "other"
    assert sum(line["total"] for line in series) == sum(range(1, CHART_SERIES + 4))


@pytest.mark.parametrize("params", [
    {"start": "2026-02-30"}, {"start": "x"}, {"end": "2026-01-01", "start": "2026-02-01"},
    {"start": "0001-01-01", "end": "9999-12-31"}, {"tenant": "a\x00b"}, {"model": "\x00"}, {"start": "9999-12-31"},
    {"tenant": "x", "start": "2026-1-1"},
])  # fmt: skip
def test_bad_parameters_show_an_error_never_a_500(staff: Client, params: dict[str, str]) -> None:
    page = staff.get(PAGE, params)
    assert page.status_code == 200
    assert page.context["error"] and b'id="gw-usage-error"' in page.content
    assert staff.get(USAGE_CSV, params).status_code == 400


def test_the_first_and_last_days_there_are_answer(staff: Client) -> None:
    for params in ({"end": "0001-01-01"}, {"start": "9999-12-31", "end": "9999-12-31"}):
        page = staff.get(PAGE, params)
        assert page.status_code == 200 and page.context["error"] is None, params
        assert staff.get(USAGE_CSV, params).status_code == 200


@pytest.mark.parametrize("query", [
    "at__year=abc", "at__month=13&at__year=2026", "at__day=99&at__month=1&at__year=2026", "status=abc",
    "status__exact=70000", "o=99", "p=-1", "p=abc", "q=%00", "tenant=%00", "at__gte=yesterday", "outcome__exact=x",
    "e=1", "all=", "_changelist_filters=%ff",
])  # fmt: skip
def test_the_console_lists_never_500(staff: Client, recorded: None, query: str) -> None:
    for listing in (LOG, LOG_CSV, "/admin/administration/usageminute/", "/admin/administration/modelprice/"):
        assert staff.get(f"{listing}?{query}").status_code in (200, 302, 400), listing


def test_the_request_log_filters_searches_and_exports(staff: Client, recorded: None) -> None:
    listing = staff.get(LOG)
    assert listing.status_code == 200 and b"Export CSV (these filters)" in listing.content
    assert b"req-0" in listing.content and b'href="/admin/administration/requestlogentry/add/' not in listing.content
    assert [row.request_id for row in staff.get(LOG, {"q": "req-1"}).context["cl"].result_list] == ["req-1"]
    assert [row.request_id for row in staff.get(LOG, {"status__exact": "429"}).context["cl"].result_list] == ["req-2"]
    assert {row.tenant for row in staff.get(LOG, {"tenant": "alice"}).context["cl"].result_list} == {"alice"}
    exported = staff.get(LOG_CSV, {"tenant": "alice"})
    rows = list(csv.DictReader(io.StringIO(content(exported).decode())))
    assert [row["request_id"] for row in rows] == ["req-1", "req-0"]
    assert rows[0]["status"] == "500" and rows[0]["at"].endswith("+00:00")
    # Read-only: no change, no delete.
    entry = RequestLogEntry.objects.get(request_id="req-0")
    assert staff.post(f"{LOG}{entry.pk}/change/", {"status": "201"}).status_code == 403
    assert staff.post(f"{LOG}{entry.pk}/delete/", {"post": "yes"}).status_code == 403


def test_staff_without_the_view_permission_is_refused(client: Client) -> None:
    user = User.objects.create_user("clerk", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(PAGE).status_code == 403
    assert client.get(USAGE_CSV).status_code == 403
    assert client.get(LOG_CSV).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_usageminute"),
                              Permission.objects.get(codename="view_requestlogentry"))
    assert client.get(PAGE).status_code == 200
    assert client.get(LOG_CSV).status_code == 200
    anonymous = Client()
    assert anonymous.get(PAGE).status_code == 302  # to the login page


def test_the_index_links_the_usage_page(staff: Client) -> None:
    index = staff.get("/admin/")
    assert PAGE.encode() in index.content and LOG.encode() in index.content


def test_a_stored_budget_with_a_bad_period_is_left_out_of_the_page(staff: Client, recorded: None) -> None:
    TenantBudget.objects.filter(tenant_id="alice").update(period="week")  # written around the console
    page = staff.get(PAGE)
    assert page.status_code == 200
    assert all(standing.tenant != "alice" or standing.source != "console" for standing in page.context["budgets"])

"""GET /usage and GET /usage/requests (issue 25, item 6): sums and spend from usage minutes the test
writes (the flush loop is tested on its own), grouping keys present only when grouped by, the price
in force at each minute, the date range limit, bad input answered 400 in the admin envelope, and who
sees what: a control-plane credential everything, a tenant key its own tenant only."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Iterator

import pytest
from django.test import Client

from administration.control_auth import reset_control_plane_auth
from administration.models import ModelPrice, RequestLogEntry, UsageMinute
from administration.usage_read import PAGE_SIZE_MAX, UsageQuery, parse_usage_query, usage
from common.config import ConfigError, GatewayConfig, install_config, parse_gateway_args
from inference.accounting import OPEN_SCOPE, SHARED_SCOPE
from inference.dataplane import reset_data_plane

pytestmark = pytest.mark.django_db

CP_KEY = "sk-cp-usage-reader"
ALICE_KEY = "sk-tenant-alice-usage"
BOB_KEY = "sk-tenant-bob-usage"
DAY1 = datetime(2026, 3, 1, tzinfo=timezone.utc)
DAY2 = datetime(2026, 3, 2, tzinfo=timezone.utc)


def at(day: datetime, hour: int, minute: int = 0) -> datetime:
    return day.replace(hour=hour, minute=minute)


def minute(tenant: str, model: str, when: datetime, **counts: int) -> UsageMinute:
    return UsageMinute.objects.create(tenant=tenant, model=model, minute=when, **counts)


def price(model: str, since: datetime, input_: str, cached: str, output: str) -> ModelPrice:
    return ModelPrice.objects.create(model=model, effective_from=since, input_per_million=Decimal(input_),
                                     cached_input_per_million=Decimal(cached), output_per_million=Decimal(output))


def configure(**fields: Any) -> None:
    config = GatewayConfig(**fields)
    install_config(config, export=False)
    reset_control_plane_auth()
    reset_data_plane(config)


@pytest.fixture
def keys() -> Iterator[None]:
    configure(control_plane_api_keys=(("ops", "ops", "admin", CP_KEY),),
              tenant_api_keys=(("alice", ALICE_KEY), ("bob", BOB_KEY)))
    yield
    configure()


@pytest.fixture
def fleet_usage() -> None:
    """Two tenants and the shared scope over two days; llama's price changes at 12:00 on day 1."""
    minute("alice", "llama", at(DAY1, 10), requests=2, errors=1, prompt_tokens=1000, completion_tokens=500,
           cached_tokens=200)
    minute("alice", "llama", at(DAY1, 13), requests=1, prompt_tokens=1000, completion_tokens=1000)
    minute("bob", "llama", at(DAY1, 23, 59), requests=1, prompt_tokens=100, completion_tokens=10)
    minute("bob", "qwen", at(DAY2, 0), requests=4, prompt_tokens=400, completion_tokens=40, cached_tokens=400)
    minute(SHARED_SCOPE, "llama", at(DAY2, 8), requests=1, prompt_tokens=10, completion_tokens=1)
    price("llama", at(DAY1, 0), "1", "0.5", "2")
    price("llama", at(DAY1, 12), "10", "5", "20")


def get(client: Client, path: str, key: str = CP_KEY, **params: Any) -> Any:
    return client.get(path, params, HTTP_AUTHORIZATION=f"Bearer {key}")


def rows_by(answer: Any, *keys: str) -> dict[tuple[str, ...], dict[str, Any]]:
    return {tuple(row[key] for key in keys): row for row in answer.json()["data"]}


def test_grouped_by_tenant_model_and_day_with_the_price_in_force(client: Client, keys: None, fleet_usage: None) -> None:
    answer = get(client, "/usage", start="2026-03-01", end="2026-03-02", group_by="tenant,model,day")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["start"], body["end"]) == ("2026-03-01", "2026-03-02")
    rows = rows_by(answer, "tenant", "model", "day")
    assert set(rows) == {("alice", "llama", "2026-03-01"), ("bob", "llama", "2026-03-01"),
                         ("bob", "qwen", "2026-03-02"), (SHARED_SCOPE, "llama", "2026-03-02")}
    alice = rows[("alice", "llama", "2026-03-01")]
    # 10:00 at the first price: 800 uncached x 1 + 200 cached x 0.5 + 500 x 2 = 1,900 per million;
    # 13:00 at the second: 1,000 x 10 + 1,000 x 20 = 30,000 per million.
    assert alice == {"tenant": "alice", "model": "llama", "day": "2026-03-01", "requests": 3, "errors": 1,
                     "prompt_tokens": 2000, "completion_tokens": 1500, "cached_tokens": 200, "spend": 0.0319}
    assert rows[("bob", "llama", "2026-03-01")]["spend"] == pytest.approx((100 * 10 + 10 * 20) / 1e6)
    assert rows[("bob", "qwen", "2026-03-02")]["spend"] == 0  # no price for qwen
    assert body["unpriced_models"] == ["qwen"]
    assert [row["day"] for row in body["data"]] == sorted(row["day"] for row in body["data"])


def test_grouping_keys_are_present_only_when_grouped_by(client: Client, keys: None, fleet_usage: None) -> None:
    totals = get(client, "/usage", start="2026-03-01", end="2026-03-02").json()["data"]
    assert totals == [{"requests": 9, "errors": 1, "prompt_tokens": 2510, "completion_tokens": 1551,
                       "cached_tokens": 600, "spend": pytest.approx(0.0319 + 0.0012 + (10 * 10 + 20) / 1e6)}]
    by_model = get(client, "/usage", start="2026-03-01", end="2026-03-02", group_by="model").json()["data"]
    assert [set(row) for row in by_model] == [{"model", "requests", "errors", "prompt_tokens", "completion_tokens",
                                               "cached_tokens", "spend"}] * 2
    assert [row["model"] for row in by_model] == ["llama", "qwen"]
    by_day = rows_by(get(client, "/usage", start="2026-03-01", end="2026-03-02", group_by="day,day"), "day")
    assert by_day[("2026-03-01",)]["requests"] == 4 and by_day[("2026-03-02",)]["requests"] == 5
    assert "tenant" not in by_day[("2026-03-01",)]


def test_filters_and_the_range_bound(client: Client, keys: None, fleet_usage: None) -> None:
    one_day = get(client, "/usage", start="2026-03-01", end="2026-03-01", group_by="tenant").json()["data"]
    assert [row["tenant"] for row in one_day] == ["alice", "bob"]  # 23:59 is day 1, 00:00 of day 2 is not
    filtered = get(client, "/usage", start="2026-03-01", end="2026-03-02", tenant="bob", model="qwen",
                   group_by="tenant,model").json()["data"]
    assert filtered == [{"tenant": "bob", "model": "qwen", "requests": 4, "errors": 0, "prompt_tokens": 400,
                         "completion_tokens": 40, "cached_tokens": 400, "spend": 0}]
    nothing = get(client, "/usage", start="2026-01-01", end="2026-01-31", group_by="tenant").json()
    assert nothing["data"] == [] and nothing["unpriced_models"] == []
    zeros = get(client, "/usage", start="2026-01-01", end="2026-01-31").json()["data"]
    assert zeros == [{"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
                      "spend": 0}]


def test_the_default_range_is_the_last_30_days() -> None:
    query = parse_usage_query({}, today=date(2026, 3, 31), max_days=366)
    assert (query.start, query.end, query.group_by) == (date(2026, 3, 2), date(2026, 3, 31), ())
    assert parse_usage_query({}, today=date(2026, 3, 31), max_days=7).start == date(2026, 3, 25)
    assert parse_usage_query({"end": "0001-01-03"}, today=date(2026, 3, 31), max_days=1).start == date(1, 1, 3)
    assert parse_usage_query({"end": "0001-01-03"}, today=date(2026, 3, 31), max_days=366).start == date.min


@pytest.mark.parametrize("params", [
    {"start": "2026-03-02", "end": "2026-03-01"},
    {"start": "2026-3-1"},
    {"start": "2026-02-30", "end": "2026-03-01"},
    {"end": "yesterday"},
    {"group_by": "tenant,worker"},
    {"group_by": "tenant, model"},
    {"tenant": "a\x00b"},
    {"start": "0001-01-01", "end": "9999-12-31"},
])  # fmt: skip
def test_bad_input_is_400_in_the_admin_envelope(client: Client, keys: None, params: dict[str, str]) -> None:
    answer = get(client, "/usage", **params)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["type"] == "bad_request" and answer.json()["error"]["message"]


def test_the_range_limit_is_a_flag(client: Client) -> None:
    assert GatewayConfig().usage_max_range_days == 366
    assert parse_gateway_args(["--usage-max-range-days", "7"]).usage_max_range_days == 7
    with pytest.raises(ConfigError):
        parse_gateway_args(["--usage-max-range-days", "0"])
    configure(usage_max_range_days=7)
    try:
        assert client.get("/usage", {"start": "2026-03-01", "end": "2026-03-07"}).status_code == 200
        refused = client.get("/usage", {"start": "2026-03-01", "end": "2026-03-08"})
        assert refused.status_code == 400 and "--usage-max-range-days" in refused.json()["error"]["message"]
    finally:
        configure()


def test_the_far_ends_of_the_calendar_answer(client: Client) -> None:
    """The last day there is (no next day to bound it) and the first: 200, never a 500."""
    minute("alice", "llama", datetime(9999, 12, 31, 23, 59, tzinfo=timezone.utc), requests=1, prompt_tokens=5)
    assert usage(UsageQuery(date(9999, 12, 31), date(9999, 12, 31)))["data"][0]["prompt_tokens"] == 5
    assert client.get("/usage", {"start": "0001-01-01", "end": "0001-01-01"}).status_code == 200


def test_a_tenant_key_sees_only_its_own_tenant(client: Client, keys: None, fleet_usage: None) -> None:
    mine = get(client, "/usage", ALICE_KEY, start="2026-03-01", end="2026-03-02", group_by="tenant,model")
    assert mine.status_code == 200
    assert [(row["tenant"], row["requests"]) for row in mine.json()["data"]] == [("alice", 3)]
    totals = get(client, "/usage", BOB_KEY, start="2026-03-01", end="2026-03-02").json()["data"]
    assert totals[0]["requests"] == 5  # bob's alone, not the fleet's 9
    assert get(client, "/usage", ALICE_KEY, tenant="alice").status_code == 200
    other = get(client, "/usage", ALICE_KEY, tenant="bob")
    assert other.status_code == 403 and other.json()["error"]["type"] == "forbidden"
    assert get(client, "/usage/requests", ALICE_KEY, tenant="bob").status_code == 403
    # Prices are the control plane's alone; an unknown key is 401.
    assert get(client, "/prices", ALICE_KEY).status_code == 401
    assert get(client, "/usage", "sk-nobody").status_code == 401
    assert client.get("/usage").status_code == 401


def test_the_shared_key_is_a_control_plane_credential_only_without_control_plane_auth(
    client: Client, fleet_usage: None
) -> None:
    configure(api_key="sk-shared-usage", tenant_api_keys=(("alice", ALICE_KEY),))
    try:
        everything = get(client, "/usage", "sk-shared-usage", start="2026-03-01", end="2026-03-02", group_by="tenant")
        assert {row["tenant"] for row in everything.json()["data"]} == {"alice", "bob", SHARED_SCOPE}
        configure(api_key="sk-shared-usage", control_plane_api_keys=(("ops", "ops", "admin", CP_KEY),))
        assert get(client, "/usage", "sk-shared-usage").status_code == 401
        configure(control_plane_api_keys=(("viewer", "viewer", "viewer", "sk-viewer"),))
        assert get(client, "/usage", "sk-viewer").status_code == 403
    finally:
        configure()
    # No key at all: the control plane is open, and so is usage (open mode's scope is :open).
    minute(OPEN_SCOPE, "llama", at(DAY1, 1), requests=1)
    tenants = get(client, "/usage", "", start="2026-03-01", end="2026-03-01", group_by="tenant").json()["data"]
    assert OPEN_SCOPE in {row["tenant"] for row in tenants}


# --- the request log -----------------------------------------------------------------------------------


def log(request_id: str, when: datetime, tenant: str = "alice", model: str = "llama", status: int = 200,
        **fields: Any) -> RequestLogEntry:
    values: dict[str, Any] = {"worker": "http://w1", "surface": "chat", "route": "/v1/chat/completions",
                              "outcome": "success" if status < 400 else "client_error", "latency_ms": 12.5,
                              "prompt_tokens": 7, "completion_tokens": 3}
    values.update(fields)
    return RequestLogEntry.objects.create(request_id=request_id, at=when, tenant=tenant, model=model, status=status,
                                          **values)


def test_the_request_log_filters_and_pages(client: Client, keys: None) -> None:
    base = at(DAY1, 9)
    for index in range(5):
        log(f"req-{index}", base + timedelta(seconds=index))
    log("req-same-a", base + timedelta(seconds=10))
    log("req-same-b", base + timedelta(seconds=10))  # the same instant: the id breaks the tie
    log("req-bob", base + timedelta(seconds=20), tenant="bob", model="qwen", status=429, error_code="rate_limited")

    first = get(client, "/usage/requests", limit=3)
    assert first.status_code == 200
    page = first.json()
    assert [row["request_id"] for row in page["data"]] == ["req-bob", "req-same-b", "req-same-a"]
    assert page["has_more"] is True
    seen = [row["request_id"] for row in page["data"]]
    while page["has_more"]:
        page = get(client, "/usage/requests", limit=3, cursor=page["next_cursor"]).json()
        seen += [row["request_id"] for row in page["data"]]
    assert seen == ["req-bob", "req-same-b", "req-same-a", "req-4", "req-3", "req-2", "req-1", "req-0"]
    assert page["next_cursor"] is None

    bob = get(client, "/usage/requests", status=429).json()["data"]
    assert [(row["request_id"], row["tenant"], row["error_code"], row["at"]) for row in bob] == [
        ("req-bob", "bob", "rate_limited", "2026-03-01T09:00:20Z")]
    assert get(client, "/usage/requests", request_id="req-2").json()["data"][0]["request_id"] == "req-2"
    window = get(client, "/usage/requests", start="2026-03-01T09:00:01Z", end="2026-03-01T10:00:03+01:00")
    assert [row["request_id"] for row in window.json()["data"]] == ["req-2", "req-1"]
    assert {row["request_id"] for row in get(client, "/usage/requests", model="qwen").json()["data"]} == {"req-bob"}
    # A tenant key: its own rows only.
    assert {row["tenant"] for row in get(client, "/usage/requests", ALICE_KEY).json()["data"]} == {"alice"}
    assert get(client, "/usage/requests", BOB_KEY).json()["data"][0]["request_id"] == "req-bob"
    # No body, header or key is in a row: the row's fields are the log's columns.
    assert set(bob[0]) == {"at", "request_id", "tenant", "model", "worker", "surface", "route", "status", "outcome",
                           "error_code", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens",
                           "tokens_estimated", "latency_ms", "ttft_ms"}


@pytest.mark.parametrize("params", [
    {"limit": "0"}, {"limit": str(PAGE_SIZE_MAX + 1)}, {"limit": "ten"}, {"status": "99"}, {"status": "2xx"},
    {"start": "2026-03-01"}, {"end": "2026-03-01T25:00:00Z"}, {"cursor": "abc"}, {"request_id": "\x00"},
    {"start": "2026-13-01T00:00:00Z"},
])  # fmt: skip
def test_bad_log_queries_are_400(client: Client, keys: None, params: dict[str, str]) -> None:
    answer = get(client, "/usage/requests", **params)
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "bad_request"


def test_any_cursor_of_the_pattern_and_any_date_time_answers(client: Client, keys: None) -> None:
    log("req-x", at(DAY1, 9))
    for params in ({"cursor": "999999999999999999_9999999999999999999"}, {"cursor": "0_0"},
                   {"start": "0001-01-01T00:00:00+23:59"}, {"end": "9999-12-31T23:59:60-23:59"},
                   {"start": "2026-03-01t09:00:00.1234567z"}):
        assert get(client, "/usage/requests", **params).status_code == 200, params

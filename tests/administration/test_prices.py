"""Model prices (issue 25, item 4): added through the control plane (/prices) and the console, never
rewritten (a change is a new row; nothing may take effect in the past), and spend counted with the
price in force at each minute, so a price change leaves spend already shown as it was."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone as django_timezone

from administration.control_auth import reset_control_plane_auth
from administration.models import ModelPrice, UsageMinute
from administration.usage_read import PRICE_MAX, UsageQuery, usage
from common.config import GatewayConfig, install_config
from inference.dataplane import reset_data_plane

pytestmark = pytest.mark.django_db

CP_KEY = "sk-cp-prices"
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {CP_KEY}"}


@pytest.fixture(autouse=True)
def control_plane() -> Iterator[None]:
    config = GatewayConfig(control_plane_api_keys=(("ops", "ops", "admin", CP_KEY),), tenant_api_keys=(("t", "sk-t"),))
    install_config(config, export=False)
    reset_control_plane_auth()
    reset_data_plane(config)
    yield
    install_config(GatewayConfig(), export=False)
    reset_control_plane_auth()
    reset_data_plane(GatewayConfig())


def post(client: Client, body: Any) -> Any:
    return client.post("/prices", body, content_type="application/json", **AUTH)


def later(**delta: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(**delta)).isoformat()


def test_a_price_is_added_and_listed(client: Client) -> None:
    added = post(client, {"model": "llama", "input_per_million": 0.5, "output_per_million": 1.5})
    assert added.status_code == 201, added.content
    body = added.json()
    assert body["model"] == "llama" and body["in_force"] is True
    assert body["cached_input_per_million"] == 0.5  # not given: the input price
    assert body["effective_from"].endswith("Z")
    scheduled = post(client, {"model": "llama", "input_per_million": 1, "cached_input_per_million": 0.1,
                              "output_per_million": 2, "effective_from": later(days=1)})
    assert scheduled.status_code == 201 and scheduled.json()["in_force"] is False
    listed = client.get("/prices", **AUTH).json()["data"]
    assert [(row["model"], row["input_per_million"], row["in_force"]) for row in listed] == [
        ("llama", 0.5, True), ("llama", 1.0, False)]
    history = client.get("/prices/llama", **AUTH).json()
    assert history["model"] == "llama" and [row["input_per_million"] for row in history["data"]] == [1.0, 0.5]
    assert ModelPrice.objects.count() == 2  # rows added, none changed


def test_a_model_id_with_a_slash_has_a_history(client: Client) -> None:
    assert post(client, {"model": "org/model-7b", "input_per_million": 1, "output_per_million": 1}).status_code == 201
    assert client.get("/prices/org/model-7b", **AUTH).json()["model"] == "org/model-7b"
    for unknown in ("unknown", "a%00b"):
        missing = client.get(f"/prices/{unknown}", **AUTH)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


@pytest.mark.parametrize("body", [
    {"model": "m", "input_per_million": 1, "output_per_million": 1, "effective_from": "2020-01-01T00:00:00Z"},
    {"model": "m", "input_per_million": -1, "output_per_million": 1},
    {"model": "m", "input_per_million": "1", "output_per_million": 1},
    {"model": "m", "input_per_million": True, "output_per_million": 1},
    {"model": "m", "input_per_million": float(PRICE_MAX) * 10, "output_per_million": 1},
    {"model": "m", "input_per_million": 1},
    {"model": " ", "input_per_million": 1, "output_per_million": 1},
    {"model": "x" * 256, "input_per_million": 1, "output_per_million": 1},
    {"model": "m", "input_per_million": 1, "output_per_million": 1, "effective_from": "tomorrow"},
    {"model": "m", "input_per_million": 1, "output_per_million": 1, "cached_input_per_million": None},
    ["not", "an", "object"],
])  # fmt: skip
def test_a_price_the_rules_refuse_is_400(client: Client, body: Any) -> None:
    answer = post(client, body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["type"] == "bad_request"
    assert not ModelPrice.objects.exists()


def test_not_json_is_400_and_the_same_moment_twice_is_409(client: Client) -> None:
    answer = client.post("/prices", b"{", content_type="application/json", **AUTH)
    assert answer.status_code == 400
    moment = later(hours=1)
    assert post(client, {"model": "m", "input_per_million": 1, "output_per_million": 1, "effective_from": moment}
                ).status_code == 201
    again = post(client, {"model": "m", "input_per_million": 2, "output_per_million": 2, "effective_from": moment})
    assert again.status_code == 409 and again.json()["error"]["type"] == "conflict"


def test_prices_are_the_control_planes_alone(client: Client) -> None:
    assert client.get("/prices").status_code == 401
    assert client.get("/prices", HTTP_AUTHORIZATION="Bearer sk-t").status_code == 401  # a tenant key
    assert client.post("/prices", {}, content_type="application/json",
                       HTTP_AUTHORIZATION="Bearer sk-t").status_code == 401


def test_a_price_change_never_rewrites_spend_already_counted() -> None:
    """Spend of past minutes stays at the old price after a new one takes effect."""
    past = django_timezone.now().replace(second=0, microsecond=0) - timedelta(hours=2)
    ModelPrice.objects.create(model="m", effective_from=past - timedelta(days=1), input_per_million=Decimal(2),
                              cached_input_per_million=Decimal(1), output_per_million=Decimal(4))
    UsageMinute.objects.create(tenant="t", model="m", minute=past, requests=1, prompt_tokens=1_000_000,
                               completion_tokens=500_000, cached_tokens=250_000)
    query = UsageQuery(past.date(), django_timezone.now().date())
    before = usage(query)["data"][0]["spend"]
    assert before == 750_000 * 2 / 1e6 + 250_000 * 1 / 1e6 + 500_000 * 4 / 1e6
    ModelPrice.objects.create(model="m", effective_from=django_timezone.now(), input_per_million=Decimal(200),
                              cached_input_per_million=Decimal(100), output_per_million=Decimal(400))
    assert usage(query)["data"][0]["spend"] == before


# --- the console -----------------------------------------------------------------------------------


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


def test_the_console_adds_a_new_row_and_never_changes_one(staff: Client) -> None:
    added = staff.post("/admin/administration/modelprice/add/", {
        "model": "llama", "input_per_million": "0.5", "cached_input_per_million": "", "output_per_million": "1.5",
        "effective_from": ""})  # fmt: skip
    assert added.status_code == 302, added.content
    row = ModelPrice.objects.get()
    assert (row.input_per_million, row.cached_input_per_million) == (Decimal("0.5"), Decimal("0.5"))
    assert row.effective_from <= django_timezone.now()
    listing = staff.get("/admin/administration/modelprice/")
    assert listing.status_code == 200 and b"in force" in listing.content and b"New price" in listing.content
    # "Editing" is a new row: the change page is read-only, and a prefilled add form makes the new one.
    page = staff.get(f"/admin/administration/modelprice/{row.pk}/change/")
    assert page.status_code == 200 and b'name="input_per_million"' not in page.content
    assert staff.post(f"/admin/administration/modelprice/{row.pk}/change/", {"model": "llama",
                      "input_per_million": "9", "output_per_million": "9"}).status_code == 403
    prefilled = staff.get("/admin/administration/modelprice/add/?model=llama&input_per_million=0.5")
    assert b'value="llama"' in prefilled.content
    later_moment = (django_timezone.now() + timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S")
    assert staff.post("/admin/administration/modelprice/add/", {
        "model": "llama", "input_per_million": "2", "cached_input_per_million": "1", "output_per_million": "3",
        "effective_from": later_moment}).status_code == 302  # fmt: skip
    assert ModelPrice.objects.count() == 2
    row.refresh_from_db()
    assert row.input_per_million == Decimal("0.5")  # the first row is untouched


def test_the_console_refuses_a_past_moment_and_deletes_only_a_scheduled_price(staff: Client) -> None:
    past = staff.post("/admin/administration/modelprice/add/", {
        "model": "llama", "input_per_million": "1", "output_per_million": "1", "effective_from": "2020-01-01 00:00:00"})
    assert past.status_code == 200 and b"This moment is past" in past.content
    negative = staff.post("/admin/administration/modelprice/add/", {
        "model": "llama", "input_per_million": "-1", "output_per_million": "1", "effective_from": ""})
    assert negative.status_code == 200 and not ModelPrice.objects.exists()
    now = django_timezone.now()
    current = ModelPrice.objects.create(model="m", effective_from=now - timedelta(hours=1), input_per_million=1,
                                        cached_input_per_million=1, output_per_million=1)
    scheduled = ModelPrice.objects.create(model="m", effective_from=now + timedelta(days=1), input_per_million=2,
                                          cached_input_per_million=2, output_per_million=2)
    assert staff.post(f"/admin/administration/modelprice/{current.pk}/delete/", {"post": "yes"}).status_code == 403
    assert staff.post(f"/admin/administration/modelprice/{scheduled.pk}/delete/", {"post": "yes"}).status_code == 302
    assert list(ModelPrice.objects.values_list("pk", flat=True)) == [current.pk]

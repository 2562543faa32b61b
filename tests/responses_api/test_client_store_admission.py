"""Every client route of the history store (the conversations and their items, stored responses) is
guarded like the data plane: a tenant over its rate limit gets the spec's 429 (Retry-After,
X-RateLimit-*; the budget is the one its inference requests use), and while the store is known down
the routes answer 503 at once in their family's format instead of waiting for a pooled connection,
one request per pause trying the store again (responses_api/api/admission.py)."""

from __future__ import annotations

import uuid
from typing import Iterator

import httpx
import pytest
from django.db import OperationalError

from common.outages import STORE
from inference.admission.rate_limit import RedisRateLimiter
from inference.dataplane import data_plane
from responses_api.api.errors import STORE_UNAVAILABLE
from tests.conftest import ALICE, CHARLIE, SHARED_KEY, Actor, GatewayFactory
from tests.responses_api.conftest import TENANT_KEYS

SHARED = {"Authorization": f"Bearer {SHARED_KEY}"}
ITEM = {"type": "message", "role": "user", "content": "hello"}
LIMIT = 4


def _limited_gateway(make_gateway: GatewayFactory, actor: Actor) -> httpx.AsyncClient:
    api = make_gateway(api_key=SHARED_KEY, tenant_api_keys=(*TENANT_KEYS, (actor.tenant_id, actor.key)),
                       tenant_rate_limits=((actor.tenant_id, str(LIMIT)),), history_backend="memory")  # fmt: skip
    limiter = data_plane().rate_limiter
    if isinstance(limiter, RedisRateLimiter):  # with REDIS_URL set: counters of this test only
        limiter.prefix = f"gw:test:rl:{uuid.uuid4().hex}:"
    return api


async def test_a_tenant_over_its_limit_gets_429_on_every_store_route(make_gateway: GatewayFactory) -> None:
    for _ in range(3):  # a fresh tenant per attempt, until one runs inside one minute's window
        actor = Actor(f"limited-{uuid.uuid4().hex[:8]}", f"sk-limited-{uuid.uuid4().hex}")
        api = _limited_gateway(make_gateway, actor)
        created = await api.post("/v1/conversations", json={"items": [ITEM]}, headers=actor.headers)
        conversation = created.json()["id"]
        allowed = [
            created,
            await api.get(f"/v1/conversations/{conversation}", headers=actor.headers),
            item := await api.post(f"/v1/conversations/{conversation}/items", json={"items": [ITEM]},
                                   headers=actor.headers),  # fmt: skip
            await api.get(f"/v1/conversations/{conversation}/items", headers=actor.headers),
        ]
        item_id = item.json()["data"][0]["id"]
        refused = {
            "create": await api.post("/v1/conversations", json={}, headers=actor.headers),
            "read": await api.get(f"/v1/conversations/{conversation}", headers=actor.headers),
            "update": await api.post(f"/v1/conversations/{conversation}", json={"metadata": {"a": "b"}},
                                     headers=actor.headers),  # fmt: skip
            "list items": await api.get(f"/v1/conversations/{conversation}/items", headers=actor.headers),
            "add items": await api.post(f"/v1/conversations/{conversation}/items", json={"items": [ITEM]},
                                        headers=actor.headers),  # fmt: skip
            "read item": await api.get(f"/v1/conversations/{conversation}/items/{item_id}", headers=actor.headers),
            "delete item": await api.delete(f"/v1/conversations/{conversation}/items/{item_id}",
                                            headers=actor.headers),  # fmt: skip
            "delete": await api.delete(f"/v1/conversations/{conversation}", headers=actor.headers),
        }
        stored_response = await api.get("/v1/responses/resp_0123456789", headers=actor.headers)
        inference = await api.post("/v1/responses", json={"model": "any", "input": "hi"}, headers=actor.headers)
        answers = [*allowed, *refused.values(), stored_response, inference]
        if len({answer.headers.get("x-ratelimit-reset") for answer in answers}) == 1:
            break
    else:
        raise AssertionError("three attempts in a row straddled a minute boundary")

    assert [answer.status_code for answer in allowed] == [200] * LIMIT, [a.text for a in allowed]
    assert [answer.headers["x-ratelimit-remaining"] for answer in allowed] == ["3", "2", "1", "0"]
    for route, answer in refused.items():
        assert answer.status_code == 429, (route, answer.text)
        assert answer.json() == {"error": "Rate limit exceeded for this API key"}, route  # the conversations' format
        assert answer.headers["x-ratelimit-limit"] == str(LIMIT) and answer.headers["x-ratelimit-remaining"] == "0"
        assert 1 <= int(answer.headers["retry-after"]) <= 60 and int(answer.headers["x-ratelimit-reset"]) % 60 == 0
    # The stored responses' routes answer in the standard envelope; the data plane counts the same budget.
    for answer in (stored_response, inference):
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["type"] == "rate_limit_error"
        assert answer.json()["error"]["code"] == "rate_limit_exceeded"
        assert answer.headers["x-gw-error-code"] == "rate_limit_exceeded" and "retry-after" in answer.headers
    # Another tenant (no limit) and the shared key are not limited.
    for headers in (CHARLIE.headers, SHARED):
        other = await api.post("/v1/conversations", json={}, headers=headers)
        assert other.status_code == 200 and "x-ratelimit-limit" not in other.headers
    # A caller with no valid key is the view's 401, counted against no one.
    assert (await api.post("/v1/conversations", json={})).status_code == 401


@pytest.fixture
def store_down() -> Iterator[None]:
    STORE.failed(OperationalError("couldn't get a connection after 3.00 sec"))
    yield
    STORE.recovered()


@pytest.mark.django_db(transaction=True)
async def test_during_a_store_outage_the_store_routes_answer_503_at_once(
    make_gateway: GatewayFactory, store_down: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = make_gateway(api_key=SHARED_KEY, tenant_api_keys=TENANT_KEYS, history_backend="db")
    headers = ALICE.headers
    # The database is up in this test: any of these that reached its view would be answered 200 or 404.
    answers = {
        "create": await api.post("/v1/conversations", json={}, headers=headers),
        "read": await api.get("/v1/conversations/conv_0123456789", headers=headers),
        "list items": await api.get("/v1/conversations/conv_0123456789/items", headers=headers),
        "add items": await api.post("/v1/conversations/conv_0123456789/items", json={"items": [ITEM]},
                                    headers=headers),  # fmt: skip
        "read item": await api.get("/v1/conversations/conv_0123456789/items/msg_0123456789", headers=headers),
        "delete": await api.delete("/v1/conversations/conv_0123456789", headers=SHARED),
    }
    for route, answer in answers.items():
        assert answer.status_code == 503, (route, answer.text)
        assert answer.json() == {"error": STORE_UNAVAILABLE} and answer.headers["retry-after"] == "5", route
    stored = await api.get("/v1/responses/resp_0123456789", headers=headers)
    assert stored.status_code == 503 and stored.headers["retry-after"] == "5"
    assert stored.json() == {"error": {"message": STORE_UNAVAILABLE, "type": "service_unavailable", "param": None,
                                       "code": "service_unavailable"}}  # fmt: skip
    assert (await api.get("/v1/conversations/conv_0123456789")).status_code == 401  # the key is checked first

    # One request per pause tries the store: it answers, and the outage is over for everyone.
    monkeypatch.setattr(STORE, "retry_secs", 0.0)
    tried = await api.post("/v1/conversations", json={}, headers=headers)
    assert tried.status_code == 200, tried.text
    assert not STORE.down
    assert (await api.get(f"/v1/conversations/{tried.json()['id']}", headers=headers)).status_code == 200


async def test_a_history_kept_outside_the_database_is_not_refused_for_its_outage(
    make_gateway: GatewayFactory, store_down: None
) -> None:
    api = make_gateway(tenant_api_keys=TENANT_KEYS, history_backend="memory")
    created = await api.post("/v1/conversations", json={}, headers=ALICE.headers)
    assert created.status_code == 200, created.text

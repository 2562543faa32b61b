"""Client authentication: shared key, tenant keys, 401 with an empty body, public routes."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import ALICE, CHARLIE, SHARED_KEY, Actor, RunningWorker, record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def secured(make_gateway, worker: RunningWorker):
    return make_gateway(
        [record_for(worker)],
        api_key=SHARED_KEY,
        tenant_api_keys=((ALICE.tenant_id, ALICE.key), (CHARLIE.tenant_id, CHARLIE.key)),
    )


async def test_no_keys_configured_leaves_the_gateway_open(gateway) -> None:
    assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", "Bearer wrong-key", "Basic c2stc2hhcmVk", f"Token {SHARED_KEY}", f"Bearer {SHARED_KEY}x"],
)
async def test_missing_or_unknown_key_is_401_with_empty_body(secured, worker: RunningWorker, authorization) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await secured.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 401
    assert response.content == b""
    assert not worker.requests()


async def test_shared_key_is_accepted(secured) -> None:
    response = await secured.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {SHARED_KEY}"})
    assert response.status_code == 200


@pytest.mark.parametrize("actor", [ALICE, CHARLIE])
async def test_tenant_keys_are_accepted(secured, actor: Actor) -> None:
    response = await secured.post("/v1/chat/completions", json=CHAT, headers=actor.headers)
    assert response.status_code == 200


async def test_bearer_scheme_is_case_insensitive(secured) -> None:
    response = await secured.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"bearer {SHARED_KEY}"})
    assert response.status_code == 200


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/liveness", "/readiness"])
async def test_public_routes_need_no_key(secured, path: str) -> None:
    assert (await secured.get(path)).status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings", "/generate", "/v1/tokenize"])
async def test_every_serving_route_is_protected(secured, path: str) -> None:
    assert (await secured.post(path, json={"model": "mock-model", "prompt": "x"})).status_code == 401


async def test_auth_runs_before_body_validation(secured) -> None:
    response = await secured.post("/v1/chat/completions", content=b"{broken")
    assert response.status_code == 401


async def test_keys_never_appear_in_errors_or_logs(secured, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    bad = await secured.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=ALICE.headers)
    wrong = await secured.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-guess"})
    for response in (bad, wrong):
        assert ALICE.key not in response.text and SHARED_KEY not in response.text
        assert "sk-guess" not in response.text
    for text in (caplog.text,):
        assert ALICE.key not in text and SHARED_KEY not in text and "sk-guess" not in text


def test_key_ring_resolves_tenant_identity() -> None:
    from inference.auth import KeyRing

    ring = KeyRing(SHARED_KEY, [(ALICE.tenant_id, ALICE.key), (CHARLIE.tenant_id, CHARLIE.key)])
    alice = ring.authenticate(f"Bearer {ALICE.key}".encode())
    charlie = ring.authenticate(f"Bearer {CHARLIE.key}".encode())
    shared = ring.authenticate(f"Bearer {SHARED_KEY}".encode())
    assert alice is not None and alice.kind == "tenant" and alice.tenant_id == "acme"
    assert charlie is not None and charlie.tenant_id == "globex"
    assert shared is not None and shared.kind == "shared" and shared.tenant_id is None
    assert ring.authenticate(b"Bearer nope") is None
    assert "sk-" not in repr(ring.__dict__.get("_by_digest"))


async def test_the_request_carries_the_tenant_identity(secured, monkeypatch) -> None:
    from inference.upstreams.http import HttpRelay

    seen = []
    original = HttpRelay.open

    async def spy(self, request):
        seen.append(request.identity)
        return await original(self, request)

    monkeypatch.setattr(HttpRelay, "open", spy)
    await secured.post("/v1/chat/completions", json=CHAT, headers=CHARLIE.headers)
    await secured.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {SHARED_KEY}"})
    assert [(i.kind, i.tenant_id) for i in seen] == [("tenant", "globex"), ("shared", None)]

"""Control-plane authentication on the real /workers routes (spec 3, Authentication)."""

from __future__ import annotations

from typing import Iterator

import pytest
from django.test import Client

from administration.control_auth import reset_control_plane_auth
from common.config import GatewayConfig, install_config
from tests.conftest import ALICE, SHARED_KEY

pytestmark = pytest.mark.django_db

ADMIN = "sk-cp-admin-1"
VIEWER = "sk-cp-viewer-2"


@pytest.fixture
def configure() -> Iterator:
    def apply(config: GatewayConfig) -> None:
        install_config(config, export=False)
        reset_control_plane_auth()

    yield apply
    install_config(GatewayConfig(), export=False)
    reset_control_plane_auth()


def get(client: Client, key: str | None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    return client.get("/workers", **headers)


def test_control_plane_keys_decide(configure) -> None:
    configure(
        GatewayConfig(
            api_key=SHARED_KEY,
            tenant_api_keys=((ALICE.tenant_id, ALICE.key),),
            control_plane_api_keys=(("k1", "ops", "admin", ADMIN), ("k2", "viewer", "user", VIEWER)),
        )
    )
    client = Client()
    assert get(client, ADMIN).status_code == 200
    forbidden = get(client, VIEWER)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "forbidden"
    for key in (None, "wrong", SHARED_KEY, ALICE.key):
        denied = get(client, key)
        assert denied.status_code == 401, key
        assert denied.json()["error"]["type"] == "unauthorized"
        assert (key or "none") not in denied.content.decode() or key is None


def test_without_control_plane_auth_only_the_shared_key_works(configure) -> None:
    configure(GatewayConfig(api_key=SHARED_KEY, tenant_api_keys=((ALICE.tenant_id, ALICE.key),)))
    client = Client()
    assert get(client, SHARED_KEY).status_code == 200
    assert get(client, ALICE.key).status_code == 401
    assert get(client, None).status_code == 401


def test_tenant_keys_without_shared_key_close_the_control_plane(configure) -> None:
    configure(GatewayConfig(tenant_api_keys=((ALICE.tenant_id, ALICE.key),)))
    assert get(Client(), ALICE.key).status_code == 401


def test_no_keys_leave_the_control_plane_open(configure) -> None:
    configure(GatewayConfig())
    assert get(Client(), None).status_code == 200

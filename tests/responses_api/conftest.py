"""Fixtures of the responses_api tests: a history store per backend, and the gateway in-process with
client keys for three actors (tests/conftest.py: alice and bob of tenant acme, charlie of globex) and
the shared key."""

from __future__ import annotations

from typing import AsyncIterator, Iterator

import httpx
import pytest

from common.config import GatewayConfig, install_config
from responses_api.storage import install_history_store
from responses_api.storage.base import HistoryStore
from responses_api.storage.db import DatabaseHistoryStore
from responses_api.storage.memory import MemoryHistoryStore
from tests.conftest import ALICE, BOB, CHARLIE, SHARED_KEY, GatewayFactory

TENANT_KEYS = ((ALICE.tenant_id, ALICE.key), (BOB.tenant_id, BOB.key), (CHARLIE.tenant_id, CHARLIE.key))
SHARED = {"Authorization": f"Bearer {SHARED_KEY}"}


# The db backend works on worker threads, which see only committed rows: a transactional test database.
BACKENDS = [pytest.param("db", marks=pytest.mark.django_db(transaction=True)), "memory"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> HistoryStore:
    """Each stateful backend."""
    if request.param == "db":
        return DatabaseHistoryStore()
    return MemoryHistoryStore(max_entries=10_000)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def api(make_gateway: GatewayFactory, backend: str) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway with tenant keys and the shared key, on each backend."""
    client = make_gateway(api_key=SHARED_KEY, tenant_api_keys=TENANT_KEYS, history_backend=backend)
    yield client
    install_history_store(None)


@pytest.fixture
async def open_api(make_gateway: GatewayFactory, transactional_db: None) -> AsyncIterator[httpx.AsyncClient]:
    # (requested as an argument, transactional_db is transactional; through getfixturevalue it is not)
    """The gateway with no key configured (open mode), db backend."""
    client = make_gateway()
    yield client
    install_history_store(None)


@pytest.fixture(autouse=True)
def _fresh_store() -> Iterator[None]:
    install_history_store(None)
    yield
    install_config(GatewayConfig(), export=False)
    install_history_store(None)

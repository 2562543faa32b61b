"""Token budgets across real processes: two gateway processes (uvicorn and daphne) over one Redis count
one budget per tenant. Every answered request's tokens (prompt plus completion, as its usage says)
reach the shared counter exactly once; once the budget is used up both processes refuse the tenant
with 429 budget_exceeded and a Retry-After; the shared key is never refused (docs/DECISIONS.md D68)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Callable

import httpx
import pytest
import redis

from tests.conftest import Actor
from tests.e2e.conftest import Process, free_port, wait_for
from tests.e2e.test_fleet_processes import REDIS, needs_redis

pytestmark = [pytest.mark.e2e, needs_redis]

SHARED_KEY = "sk-e2e-budget-shared-key"
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
BUDGET = 100  # tokens a month: a handful of the mock worker's answers


def _two_gateways(spawn: Callable[..., Process], worker: Process, flags: list[str], db: int) -> tuple[Process, Process]:
    env = {"REDIS_URL": f"{REDIS}/{db}", "GW_HEALTH_CHECK_INTERVAL_SECS": "0.5"}
    gateways = []
    for server in ("uvicorn", "daphne"):
        port = free_port()
        args = ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", server,
                "--api-key", SHARED_KEY, *flags]
        gateways.append(spawn(f"gateway-{server}-{port}", args, port, ready_path="/liveness", env=env))
    admin = {"Authorization": f"Bearer {SHARED_KEY}"}
    registered = httpx.post(f"{gateways[0].url}/workers", json={"url": worker.url}, headers=admin)
    assert registered.status_code == 202, registered.text
    for gateway in gateways:
        wait_for(lambda: httpx.get(gateway.url + "/readiness").status_code == 200, 30, f"{gateway.name} ready")
    return gateways[0], gateways[1]


def test_two_gateway_processes_share_one_token_budget(spawn: Callable[..., Process], mock_worker_process: Process) -> None:
    run = uuid.uuid4().hex[:8]
    actor = Actor(f"budget-{run}", f"sk-budget-{run}-{uuid.uuid4().hex}")
    db = 1 + uuid.uuid4().int % 14
    month = datetime.now(timezone.utc).strftime("%Y-%m")
    first, second = _two_gateways(
        spawn, mock_worker_process,
        ["--tenant-api-key", f"{actor.tenant_id}:{actor.key}", "--tenant-budget", f"{actor.tenant_id}={BUDGET}/month"],
        db,
    )
    used = 0
    refused: httpx.Response | None = None
    with httpx.Client(timeout=30) as client:
        for index in range(200):
            answer = client.post((first, second)[index % 2].url + "/v1/chat/completions", json=CHAT, headers=actor.headers)
            if answer.status_code == 429:
                refused = answer
                break
            assert answer.status_code == 200, answer.text
            usage = answer.json()["usage"]
            used += usage["prompt_tokens"] + usage["completion_tokens"]

        assert refused is not None, "never refused"
        assert used >= BUDGET  # nothing refused before the budget was used up
        assert refused.headers["x-gw-error-code"] == "budget_exceeded"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(refused.headers["retry-after"]) <= 31 * 86_400

        def both_refuse() -> bool:  # the other process sees the shared count within one sync
            nonlocal used
            refusing = True
            for gateway in (first, second):
                answer = client.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=actor.headers)
                if answer.status_code == 200:  # admitted before its view caught up: charged too
                    usage = answer.json()["usage"]
                    used += usage["prompt_tokens"] + usage["completion_tokens"]
                refusing = refusing and answer.status_code == 429
            return refusing

        wait_for(both_refuse, 10, "both processes refuse the tenant")
        shared = {"Authorization": f"Bearer {SHARED_KEY}"}
        for gateway in (first, second):  # the shared key is never budgeted
            assert client.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=shared).status_code == 200

    if datetime.now(timezone.utc).strftime("%Y-%m") != month:
        pytest.skip("the month changed during the test: its counter is another key")
    store = redis.Redis.from_url(f"{REDIS}/{db}")
    key = f"gw:budget:{actor.tenant_id}:month:{month}"
    try:  # the last charges are sent within one sync: every answered request's tokens, exactly once
        wait_for(lambda: int(store.get(key) or 0) == used, 10, f"the shared counter at {used}")
    finally:
        print("shared counter", store.get(key), "answered tokens", used)
    store.delete(key)
    store.close()

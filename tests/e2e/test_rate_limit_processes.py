"""Per-tenant rate limits across real processes: two gateway processes (uvicorn and daphne) sharing one
store and one Redis count one budget per tenant, and a limit edited in one gateway's admin console
reaches the other without a restart."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from typing import Callable

import httpx
import pytest

from tests.conftest import Actor
from tests.e2e.conftest import ROOT, Process, free_port, wait_for
from tests.e2e.test_fleet_processes import REDIS, needs_redis

pytestmark = [pytest.mark.e2e, needs_redis]

ADMIN_KEY = "sk-e2e-rate-admin-key"
USERNAME = "limits-admin"
PASSWORD = "e2e-Limits-passw0rd"
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
LIMITS = "/admin/administration/tenantratelimit/"


def _actors(count: int) -> list[Actor]:
    """Tenants of this run only: their Redis counters cannot meet another run's."""
    run = uuid.uuid4().hex[:8]
    return [Actor(f"rl-{run}-{index}", f"sk-rl-{run}-{index}-{uuid.uuid4().hex}") for index in range(count)]


def _two_gateways(spawn: Callable[..., Process], worker: Process, flags: list[str]) -> tuple[Process, Process]:
    """A uvicorn and a daphne gateway over the suite's store and one Redis; the worker registered
    through the first and routable on both."""
    env = {"REDIS_URL": f"{REDIS}/{1 + uuid.uuid4().int % 14}", "GW_HEALTH_CHECK_INTERVAL_SECS": "0.5"}
    gateways = []
    for server in ("uvicorn", "daphne"):
        port = free_port()
        args = ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", server,
                "--api-key", ADMIN_KEY, *flags]
        gateways.append(spawn(f"gateway-{server}-{port}", args, port, ready_path="/liveness", env=env))
    first, second = gateways
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    registered = httpx.post(f"{first.url}/workers", json={"url": worker.url}, headers=admin)
    assert registered.status_code == 202, registered.text
    for gateway in gateways:
        wait_for(lambda: httpx.get(gateway.url + "/readiness").status_code == 200, 30, f"{gateway.name} ready")
    return first, second


def _key_flags(actors: list[Actor]) -> list[str]:
    return [flag for actor in actors for flag in ("--tenant-api-key", f"{actor.tenant_id}:{actor.key}")]


def test_two_gateway_processes_share_one_tenant_budget(spawn, mock_worker_process) -> None:
    limit, extra = 6, 3
    actors = _actors(3)  # a fresh tenant (and so a fresh count) for each attempt
    first, second = _two_gateways(spawn, mock_worker_process, [*_key_flags(actors), "--default-tenant-rate-limit", str(limit)])
    with httpx.Client(timeout=30) as client:
        for actor in actors:
            responses = [
                client.post((first, second)[index % 2].url + "/v1/chat/completions", json=CHAT, headers=actor.headers)
                for index in range(limit + extra)
            ]
            if len({r.headers.get("x-ratelimit-reset") for r in responses}) == 1:
                break  # every request counted in one minute window
        else:
            raise AssertionError("three attempts in a row straddled a minute boundary")
    statuses = [r.status_code for r in responses]
    assert statuses == [200] * limit + [429] * extra  # exactly the limit succeeds, across both processes
    assert [r.headers["x-ratelimit-remaining"] for r in responses] == [
        str(n) for n in range(limit - 1, -1, -1)
    ] + ["0"] * extra  # counting down request by request, whichever process answered
    assert {r.headers["x-ratelimit-limit"] for r in responses} == {str(limit)}
    reset = int(responses[0].headers["x-ratelimit-reset"])
    assert reset % 60 == 0 and reset > time.time() - 5
    for refused in responses[limit:]:
        assert refused.headers["x-gw-error-code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert all(r.json()["choices"][0]["message"]["content"] for r in responses[:limit])


def _csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


def _console_post(console: httpx.Client, path: str, form: dict[str, str]) -> None:
    """Submit an admin form as a browser does (token from the page); the admin redirects on success."""
    page = console.get(path)
    assert page.status_code == 200, page.text[:500]
    done = console.post(path, data={"csrfmiddlewaretoken": _csrf(page), **form})
    assert done.status_code == 302, done.text[:2000]


def _limit_seen(gateway: Process, actor: Actor) -> str | None:
    response = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=actor.headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.headers.get("x-ratelimit-limit")


def test_console_edit_reaches_a_second_gateway_without_restart(spawn, mock_worker_process) -> None:
    (actor,) = _actors(1)
    first, second = _two_gateways(spawn, mock_worker_process, _key_flags([actor]))
    env = {**first.env, "GW_ADMIN_USERNAME": USERNAME, "GW_ADMIN_PASSWORD": PASSWORD}
    made = subprocess.run([sys.executable, "manage.py", "ensure_admin"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert _limit_seen(second, actor) is None  # no limit yet
    pid = second.popen.pid

    with httpx.Client(base_url=first.url, timeout=30) as console:
        _console_post(console, "/admin/login/", {"username": USERNAME, "password": PASSWORD, "next": "/admin/"})
        _console_post(console, LIMITS + "add/", {"tenant_id": actor.tenant_id, "requests_per_minute": "1000"})
        wait_for(lambda: _limit_seen(second, actor) == "1000", 30, "the added limit on the second gateway")

        row = re.search(rf'href="{LIMITS}(\d+)/change/', console.get(LIMITS).text)
        assert row, "the row is listed"
        change = f"{LIMITS}{row.group(1)}/change/"
        _console_post(console, change, {"tenant_id": actor.tenant_id, "requests_per_minute": "500"})
        wait_for(lambda: _limit_seen(second, actor) == "500", 30, "the changed limit on the second gateway")

        _console_post(console, f"{LIMITS}{row.group(1)}/delete/", {"post": "yes"})
        wait_for(lambda: _limit_seen(second, actor) is None, 30, "the deleted limit on the second gateway")
    assert second.popen.poll() is None and second.popen.pid == pid  # the same process throughout

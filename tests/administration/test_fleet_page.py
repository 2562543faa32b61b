"""The console's fleet page and its JSON: staff only, every worker with its stored status and live
state, and per-worker request counters that rise with requests relayed through the gateway."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.test import AsyncClient, Client

from administration import fleet_page
from administration.models import Worker, WorkerStatus
from inference.routing.breaker import Resilience
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerRecord
from tests.conftest import GatewayFactory, WorkerFactory, record_for

ROOT = Path(__file__).resolve().parents[2]
LIST = "/admin/administration/worker/"
PAGE = "/admin/administration/worker/fleet/"
DATA = "/admin/administration/worker/fleet/data/"
SECRET = "sk-fleet-worker-secret-55d1"
WORKER_KEYS = {
    "id", "url", "change_url", "model_id", "worker_type", "runtime_type", "status", "status_label", "healthy",
    "in_snapshot", "in_flight", "breaker_state", "overloaded", "engine", "requests_total", "failures_total",
}


def make_worker(url: str, **fields: Any) -> Worker:
    values: dict[str, Any] = {"registered": True, "status": WorkerStatus.READY, "model_id": "llama-3",
                              "runtime_type": "sglang", "api_key": SECRET}
    values.update(fields)
    return Worker.objects.create(url=url, **values)


def record_of(worker: Worker, **fields: Any) -> WorkerRecord:
    return WorkerRecord(id=str(worker.pk), url=worker.url, model_id=worker.model_id or None,
                        runtime_type=worker.runtime_type, status=worker.status, api_key=worker.api_key, **fields)


@pytest.fixture(autouse=True)
def empty_registry() -> Iterator[None]:
    REGISTRY.publish([], {})
    yield
    REGISTRY.publish([], {})


# --- access ----------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", [PAGE, DATA])
def test_fleet_page_and_data_need_a_staff_login(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith(f"/admin/login/?next={path}")
    User.objects.create_user("carol", password="pw-not-staff-123")
    client.login(username="carol", password="pw-not-staff-123")
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


@pytest.mark.django_db
@pytest.mark.parametrize("path", [PAGE, DATA])
def test_staff_without_the_worker_view_permission_is_refused(client: Client, path: str) -> None:
    User.objects.create_user("sam", password="pw-staff-123", is_staff=True)
    client.login(username="sam", password="pw-staff-123")
    assert client.get(path).status_code == 403


@pytest.mark.django_db
def test_a_viewer_sees_the_page_and_its_data(client: Client) -> None:
    make_worker("http://10.0.0.5:8000")
    viewer = User.objects.create_user("vera", password="pw-viewer-123", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_worker"))
    client.login(username="vera", password="pw-viewer-123")
    assert "http://10.0.0.5:8000" in client.get(PAGE).content.decode()
    assert [w["url"] for w in client.get(DATA).json()["workers"]] == ["http://10.0.0.5:8000"]


# --- the page --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_page_lists_the_workers_and_loads_the_chart_script(admin_client: Client) -> None:
    ready = make_worker("http://10.0.0.5:8000")
    make_worker("http://10.0.0.6:8000", status=WorkerStatus.PENDING, model_id="")
    REGISTRY.publish([record_of(ready)], {})
    REGISTRY.snapshot.workers[0].load.in_flight = 4

    response = admin_client.get(PAGE)
    page = response.content.decode()

    assert response.status_code == 200 and response.templates[0].name == "admin/administration/worker/fleet.html"
    assert '<script src="/static/administration/fleet.js" defer></script>' in page
    assert f'data-url="{DATA}"' in page and 'data-refresh-secs="2"' in page and 'data-points="60"' in page
    for chart in ("gw-chart-rate", "gw-chart-inflight", "gw-chart-engine", "gw-chart-usage", "gw-health"):
        assert f'id="{chart}"' in page
    assert f'<a href="{LIST}{ready.pk}/change/">http://10.0.0.5:8000</a>' in page
    assert '<span class="gw-badge gw-status-ready">Ready</span>' in page
    assert '<span class="gw-badge gw-status-pending">Pending</span>' in page
    assert '<span class="gw-badge gw-breaker-closed">closed</span>' in page
    assert '<td class="field-in_flight">4</td>' in page
    initial = json.loads(page.split('<script id="gw-fleet-initial" type="application/json">')[1].split("</script>")[0])
    assert [w["url"] for w in initial["workers"]] == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    assert SECRET not in page


@pytest.mark.django_db
def test_page_without_workers_says_so(admin_client: Client) -> None:
    page = admin_client.get(PAGE).content.decode()
    assert '<td colspan="10">No workers registered.</td>' in page
    assert '"workers": []' in page


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "shown"), [("5", "5"), ("0.1", "0.5"), ("1000", "60"), ("abc", "2"), ("nan", "2")])
def test_refresh_interval_comes_from_the_query(admin_client: Client, query: str, shown: str) -> None:
    page = admin_client.get(f"{PAGE}?refresh={query}").content.decode()
    assert f'data-refresh-secs="{shown}"' in page
    assert f'<option value="{shown}" selected>{shown} s</option>' in page


@pytest.mark.django_db
def test_the_worker_list_and_the_admin_index_link_to_the_page(admin_client: Client) -> None:
    assert f'<a href="{PAGE}" class="gw-fleet-link"' in admin_client.get(LIST).content.decode()
    index = admin_client.get("/admin/").content.decode()
    assert f'<a href="{PAGE}">Fleet charts</a>' in index
    assert 'href="/admin/administration/worker/"' in index  # the app list is still there


@pytest.mark.django_db
def test_the_index_shows_no_fleet_link_to_staff_who_cannot_view_workers(client: Client) -> None:
    User.objects.create_user("sam", password="pw-staff-123", is_staff=True)
    client.login(username="sam", password="pw-staff-123")
    assert PAGE not in client.get("/admin/").content.decode()


def test_the_chart_script_is_a_static_file() -> None:
    found = finders.find("administration/fleet.js")
    assert found is not None and "function drawChart" in Path(str(found)).read_text()


# --- the JSON ----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_data_has_each_workers_status_live_state_and_counters(admin_client: Client) -> None:
    live = make_worker("http://10.0.0.5:8000", runtime_type="sglang", worker_type="decode")
    absent = make_worker("http://10.0.0.6:8000", status=WorkerStatus.NOT_READY, model_id="")
    REGISTRY.publish([record_of(live, resilience=Resilience(failure_threshold=1))], {})
    load = REGISTRY.snapshot.workers[0].load
    load.in_flight = 2
    load.engine_load = (
        {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "token_usage": 0.5},
        {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 4, "token_usage": 0.25},
    )
    load.overloaded = True
    load.breaker.record(True)  # threshold 1: the breaker opens
    before = time.time()

    response = admin_client.get(DATA)

    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]  # an admin view: never cached
    body = response.json()
    assert set(body) == {"server_time", "counters", "loads_polled_at", "workers"}
    assert before <= body["server_time"] <= time.time() + 1 and body["counters"] == "this_process"
    first, second = body["workers"]
    assert set(first) == WORKER_KEYS and set(second) == WORKER_KEYS
    assert {key: first[key] for key in WORKER_KEYS - {"requests_total", "failures_total"}} == {
        "id": str(live.pk), "url": "http://10.0.0.5:8000", "change_url": f"{LIST}{live.pk}/change/",
        "model_id": "llama-3", "worker_type": "decode", "runtime_type": "sglang", "status": "ready",
        "status_label": "Ready", "healthy": True, "in_snapshot": True, "in_flight": 2, "breaker_state": "open",
        "overloaded": True,
        "engine": {"running_requests": 5, "waiting_requests": 5, "token_usage": 0.375, "dp_ranks": 2},
    }
    assert {key: second[key] for key in ("id", "model_id", "status", "healthy", "in_snapshot", "in_flight",
                                         "breaker_state", "engine", "overloaded")} == {
        "id": str(absent.pk), "model_id": None, "status": "not_ready", "healthy": False, "in_snapshot": False,
        "in_flight": None, "breaker_state": None, "engine": None, "overloaded": False,
    }
    assert SECRET not in response.content.decode()


@pytest.mark.django_db
def test_data_query_count_does_not_grow_with_workers(admin_client: Client, django_assert_max_num_queries) -> None:
    make_worker("http://one:1")
    admin_client.get(DATA)  # warm up (session, user)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        admin_client.get(DATA)
    for n in range(2, 8):
        make_worker(f"http://w{n}:1")
    with django_assert_max_num_queries(len(one.captured_queries)):
        body = admin_client.get(DATA).json()
    assert len(body["workers"]) == 7


def test_counters_read_the_per_worker_outcome_counter() -> None:
    from common import telemetry as metrics

    url = "http://counted-in-process:1"
    before = fleet_page.worker_request_counters().get(url, {"requests": 0, "failures": 0})
    metrics.record_breaker_outcome(url, False)
    metrics.record_breaker_outcome(url, False)
    metrics.record_breaker_outcome(url, True)
    after = fleet_page.worker_request_counters()[url]
    assert (after["requests"] - before["requests"], after["failures"] - before["failures"]) == (3, 1)


def test_counters_in_multiprocess_mode_sum_every_process(tmp_path: Path) -> None:
    """Two real processes write prometheus_client's multiprocess files; the page reads their sum."""
    script = (
        "import sys\n"
        "from common import telemetry as metrics\n"
        "assert metrics.MULTIPROCESS\n"
        "for outcome in sys.argv[1:]:\n"
        "    metrics.record_breaker_outcome('http://a:1' if outcome[0] == 'a' else 'http://b:1', outcome.endswith('!'))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for outcomes in (["a", "a", "a!", "b"], ["a", "b!", "b!"]):
        subprocess.run([sys.executable, "-c", script, *outcomes], cwd=ROOT, env=env, check=True, timeout=60)
    assert len(list(tmp_path.glob("counter_*.db"))) == 2
    assert fleet_page.worker_request_counters(str(tmp_path)) == {
        "http://a:1": {"requests": 4, "failures": 1},
        "http://b:1": {"requests": 3, "failures": 2},
    }


def test_refresh_secs_bounds() -> None:
    assert [fleet_page.refresh_secs(raw) for raw in (None, "", "3", "0", "-1", "61", "inf", "x")] == [
        2.0, 2.0, 3.0, 0.5, 0.5, 60.0, 60.0, 2.0
    ]


# --- counters rise with relayed requests -------------------------------------------------------------------

CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hello"}]}


@pytest.mark.django_db(transaction=True)
async def test_counters_rise_with_requests_relayed_through_the_gateway(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    one, two = await start_worker(model="model-a"), await start_worker(model="model-b")
    rows = [
        await sync_to_async(make_worker)(one.url, model_id="model-a"),
        await sync_to_async(make_worker)(two.url, model_id="model-b"),
    ]
    user = await sync_to_async(User.objects.create_superuser)("root", password="pw-root-123")
    gateway = make_gateway([dataclasses.replace(record_for(w), id=str(row.pk)) for w, row in zip((one, two), rows)])
    console = AsyncClient()
    await console.aforce_login(user)

    async def counters() -> tuple[float, dict[str, tuple[int, int]]]:
        body = (await console.get(DATA)).json()
        return body["server_time"], {w["url"]: (w["requests_total"], w["failures_total"]) for w in body["workers"]}

    started, before = await counters()
    for _ in range(3):
        assert (await gateway.post("/v1/chat/completions", json={**CHAT, "model": "model-a"})).status_code == 200
    assert (await gateway.post("/v1/chat/completions", json={**CHAT, "model": "model-b", "stream": True})).status_code == 200
    failing = {**CHAT, "model": "model-b", "mock": {"status": 500}}
    assert (await gateway.post("/v1/chat/completions", json=failing)).status_code == 500
    ended, after = await counters()

    assert ended >= started
    assert after[one.url][0] - before[one.url][0] == 3 and after[one.url][1] == before[one.url][1]
    assert (after[two.url][0] - before[two.url][0], after[two.url][1] - before[two.url][1]) == (2, 1)
    assert len(one.requests()) == 3 and len(two.requests()) == 2  # the requests really reached the workers

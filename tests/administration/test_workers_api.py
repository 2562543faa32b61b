"""/workers: every answer of the spec's tables, with real registration jobs (in-process job threads),
real health checks from a running fleet, and real mock workers on loopback."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Callable

import pytest
from django.test import AsyncClient

from administration.registry_sync import RegistrySync
from administration.models import Worker, WorkerStatus
from common.config import GatewayConfig
from inference.routing.registry import REGISTRY
from tests.administration.fleet import running_fleet
from tests.conftest import free_port, until

pytestmark = pytest.mark.django_db(transaction=True)

FAST = GatewayConfig(
    worker_startup_check_interval=0.2,
    worker_startup_timeout_secs=1.0,
    health_check_interval_secs=0.2,
    health_success_threshold=2,
    health_failure_threshold=2,
    drain_settle_secs=0.5,
)


@pytest.fixture
async def fleet() -> AsyncIterator[RegistrySync]:
    async with running_fleet(FAST) as running:
        yield running


@pytest.fixture
def api() -> AsyncClient:
    return AsyncClient()


async def snapshot_reaches(check: Callable[[], bool]) -> None:
    """The registry snapshot follows the stored state a moment after it (an async refresh)."""

    async def reached() -> bool:
        return check()

    await until(reached)


async def post(api: AsyncClient, body: Any, **extra: Any):
    return await api.post("/workers", body, content_type="application/json", **extra)


async def register(api: AsyncClient, body: dict[str, Any], status: str = "ready") -> dict[str, Any]:
    response = await post(api, body)
    assert response.status_code == 202, response.content
    worker_id = response.json()["worker_id"]

    async def reached() -> bool:
        got = await api.get(f"/workers/{worker_id}")
        return got.status_code == 200 and got.json()["status"] == status and "job_status" not in got.json()

    await until(reached)
    return (await api.get(f"/workers/{worker_id}")).json()


def free_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


async def test_post_registers_a_worker_that_becomes_ready(api, fleet, worker) -> None:
    response = await post(api, {"url": worker.url, "api_key": "sk-worker-secret", "labels": {"zone": "a"}})
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "accepted" and body["url"] == worker.url
    assert body["location"] == f"/workers/{body['worker_id']}" and response["Location"] == body["location"]
    uuid.UUID(body["worker_id"])

    async def ready() -> bool:
        return (await api.get(body["location"])).json()["status"] == "ready"

    await until(ready)
    got = (await api.get(body["location"])).json()
    assert got["is_healthy"] is True and got["runtime_type"] == "sglang" and got["model_id"] == "mock-model"
    assert got["labels"]["zone"] == "a" and got["labels"]["served_model_name"] == "mock-model"
    assert (got["priority"], got["cost"], got["worker_type"], got["load"]) == (50, 1.0, "regular", 0)
    assert "api_key" not in got and "sk-worker-secret" not in str(got)
    await snapshot_reaches(lambda: REGISTRY.snapshot.routable_models == ("mock-model",))


async def test_pending_worker_is_not_listed_until_registered(api, fleet) -> None:
    response = await post(api, {"url": free_url()})
    worker_id = response.json()["worker_id"]
    listing = (await api.get("/workers")).json()
    assert listing["total"] == 0 and listing["workers"] == []
    got = (await api.get(f"/workers/{worker_id}")).json()
    assert got["job_status"]["job_type"] == "AddWorker" and got["job_status"]["status"] in ("pending", "processing")


async def test_failed_registration_releases_the_id(api, fleet) -> None:
    response = await post(api, {"url": free_url()})
    location = response.json()["location"]

    async def released() -> bool:
        return (await api.get(location)).status_code == 404

    await until(released)
    body = (await api.get(location)).json()
    assert body["code"] == "WORKER_NOT_FOUND"


@pytest.mark.parametrize("url", ["grpc://127.0.0.1:1", "ipc:///tmp/engine"])
async def test_zmq_and_unreachable_grpc_workers_fail_registration(api, fleet, url: str) -> None:
    response = await post(api, {"url": url})
    assert response.status_code == 202
    location = response.json()["location"]

    async def released() -> bool:
        return (await api.get(location)).status_code == 404

    await until(released)


async def test_list_filters_by_model_and_counts_types(api, fleet, start_worker) -> None:
    llama = await start_worker(model="llama")
    qwen = await start_worker(model="qwen")
    await register(api, {"url": llama.url, "models": [{"id": "llama", "aliases": ["fast"]}]})
    await register(api, {"url": qwen.url, "worker_type": "prefill"})
    everything = (await api.get("/workers")).json()
    assert everything["total"] == 2
    assert everything["stats"] == {"prefill_count": 1, "decode_count": 0, "regular_count": 1}
    only = (await api.get("/workers?model=fast")).json()
    assert [w["url"] for w in only["workers"]] == [llama.url]
    assert only["workers"][0]["models"][0]["model_type"] == ["chat", "completions", "responses", "tools"]
    prefill = [w for w in everything["workers"] if w["worker_type"] == "prefill"][0]
    assert prefill["pd_pairing"] == "sglang/http/single"


async def test_duplicate_url_answers_409(api, fleet, worker) -> None:
    not_up_yet = free_url()  # registration keeps probing it for the startup timeout
    first = await post(api, {"url": not_up_yet})
    in_progress = await post(api, {"url": not_up_yet})
    assert in_progress.status_code == 409 and in_progress.json()["code"] == "WORKER_CREATE_IN_PROGRESS"
    assert first.json()["worker_id"] in in_progress.json()["error"]

    registered = await register(api, {"url": worker.url})
    again = await post(api, {"url": worker.url})
    assert again.status_code == 409 and again.json()["code"] == "WORKER_ALREADY_EXISTS"
    assert registered["id"] in again.json()["error"]


@pytest.mark.parametrize(
    ("content_type", "raw", "status"),
    [
        ("text/plain", b'{"url": "http://x:1"}', 415),
        ("application/json", b"{not json", 400),
        ("application/json", b"{}", 422),
        ("application/json", b'{"url": 5}', 422),
        ("application/json", b'{"url": "http://x:1", "worker_type": "giant"}', 422),
        ("application/json", b'{"url": "http://x:1", "runtime_type": "engine_z"}', 422),
        ("application/json", b'{"url": "http://x:1", "priority": "high"}', 422),
        ("application/json", b'{"url": "http://x:1", "health": {"timeout_secs": -1}}', 422),
        ("application/json", b'{"url": "http://x:1", "models": [{"aliases": []}]}', 422),
        ("application/json", b'{"url": "http://x:1", "labels": {"a": 1}}', 422),
    ],
)
async def test_bodies_that_do_not_parse_get_plain_text(api, content_type: str, raw: bytes, status: int) -> None:
    response = await api.post("/workers", raw, content_type=content_type)
    assert response.status_code == status
    assert response["Content-Type"].startswith("text/plain")
    if status == 422:
        assert response.content.startswith(b"Failed to deserialize the JSON body into the target type")
    assert not await Worker.objects.aexists()


@pytest.mark.parametrize(
    "url", ["", "HTTP://upper:1", "ftp://x:1", "http://", "ipc://", "http://bad host:1", "http://x:99999", "localhost:8000"]
)
async def test_bad_urls_are_400_bad_request(api, url: str) -> None:
    response = await post(api, {"url": url})
    assert response.status_code == 400
    assert response.json()["code"] == "BAD_REQUEST" and response.json()["error"]


async def test_unknown_fields_are_ignored_and_runtime_alias_is_stored_by_real_name(api, fleet, worker) -> None:
    got = await register(api, {"url": worker.url, "runtime": "engine_b", "surprise": {"x": 1}})
    assert got["runtime_type"] == "vllm"


async def test_known_provider_host_registers_as_external(api, fleet) -> None:
    response = await post(api, {"url": "https://api.openai.com", "api_key": "sk-provider"})
    assert response.status_code == 202
    got = None

    async def registered() -> bool:
        nonlocal got
        got = (await api.get(response.json()["location"])).json()
        return got.get("status") == "ready"

    await until(registered)
    assert got is not None and got["runtime_type"] == "external" and "api_key" not in got


async def test_worker_id_must_be_a_uuid_and_exist(api) -> None:
    bad = await api.get("/workers/not-a-uuid")
    assert bad.status_code == 400 and bad.json()["code"] == "BAD_REQUEST"
    missing = await api.get(f"/workers/{uuid.uuid4()}")
    assert missing.status_code == 404 and missing.json()["code"] == "WORKER_NOT_FOUND"
    for method in ("patch", "put", "delete"):
        call = getattr(api, method)
        kwargs: dict[str, Any] = {"content_type": "application/json"}
        response = await (call(f"/workers/{uuid.uuid4()}", {"url": "http://x:1"}, **kwargs) if method != "delete" else call(f"/workers/{uuid.uuid4()}"))
        assert response.status_code == 404 and response.json()["code"] == "WORKER_NOT_FOUND"


async def test_patch_merges_labels_and_changes_fields(api, fleet, worker) -> None:
    got = await register(api, {"url": worker.url, "labels": {"zone": "a", "rack": "1"}})
    response = await api.patch(
        f"/workers/{got['id']}", {"labels": {"rack": "2"}, "priority": 10, "cost": 2.5}, content_type="application/json"
    )
    assert response.status_code == 202
    assert response.json() == {"status": "accepted", "worker_id": got["id"], "message": response.json()["message"]}

    async def applied() -> bool:
        return (await api.get(f"/workers/{got['id']}")).json()["priority"] == 10

    await until(applied)
    after = (await api.get(f"/workers/{got['id']}")).json()
    assert after["labels"]["zone"] == "a" and after["labels"]["rack"] == "2" and after["cost"] == 2.5


async def test_patch_with_an_unknown_parser_name_is_400_and_changes_nothing(api, fleet, worker) -> None:
    got = await register(api, {"url": worker.url, "labels": {"zone": "a"}})
    response = await api.patch(
        f"/workers/{got['id']}", {"labels": {"tool_parser": "no_such_parser"}, "priority": 9}, content_type="application/json"
    )
    assert response.status_code == 400 and response.json()["code"] == "BAD_REQUEST"  # refused at the request
    assert "no_such_parser" in response.json()["error"]
    after = (await api.get(f"/workers/{got['id']}")).json()
    assert "job_status" not in after
    assert "tool_parser" not in after["labels"] and after["priority"] == 50


async def test_put_replaces_the_spec_with_defaults(api, fleet, worker) -> None:
    got = await register(api, {"url": worker.url, "priority": 7, "labels": {"zone": "a"}})
    response = await api.put(f"/workers/{got['id']}", {"url": worker.url, "cost": 3.0}, content_type="application/json")
    assert response.status_code == 202

    async def replaced() -> bool:
        body = (await api.get(f"/workers/{got['id']}")).json()
        return body["cost"] == 3.0 and body["status"] == "ready" and "job_status" not in body

    await until(replaced)
    after = (await api.get(f"/workers/{got['id']}")).json()
    assert after["id"] == got["id"] and after["priority"] == 50 and "zone" not in after["labels"]


async def test_put_must_keep_the_url(api, fleet, worker) -> None:
    got = await register(api, {"url": worker.url})
    response = await api.put(f"/workers/{got['id']}", {"url": "http://other:1"}, content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "BAD_REQUEST"


async def test_failed_put_leaves_the_worker_with_a_failed_job_status(api, fleet, start_worker) -> None:
    # What only the job can find: the worker refuses the new key (out-of-range overload values, the
    # failure this test provoked before, are refused at the request: test_request_rules.py).
    worker = await start_worker(api_key="sk-worker-key")
    got = await register(api, {"url": worker.url, "api_key": "sk-worker-key"})
    response = await api.put(
        f"/workers/{got['id']}", {"url": worker.url, "api_key": "sk-not-the-key"}, content_type="application/json"
    )
    assert response.status_code == 202

    async def failed() -> bool:
        body = (await api.get(f"/workers/{got['id']}")).json()
        return body.get("job_status", {}).get("status") == "failed"

    await until(failed)
    body = (await api.get(f"/workers/{got['id']}")).json()
    assert body["job_status"]["job_type"] == "AddWorker" and "refused" in body["job_status"]["message"]
    assert isinstance(body["job_status"]["timestamp"], int) and body["job_status"]["worker_url"] == worker.url


async def test_delete_drains_a_ready_worker_then_removes_it(api, fleet, worker) -> None:
    got = await register(api, {"url": worker.url})
    response = await api.delete(f"/workers/{got['id']}")
    assert response.status_code == 202

    async def draining() -> bool:
        return (await api.get(f"/workers/{got['id']}")).json().get("status") == "draining"

    await until(draining)
    await snapshot_reaches(lambda: all(h.id != got["id"] for h in REGISTRY.snapshot.routable))

    async def removed() -> bool:
        return (await api.get(f"/workers/{got['id']}")).status_code == 404

    await until(removed)


async def test_delete_of_a_not_ready_worker_removes_at_once(api, fleet, start_worker) -> None:
    sick = await start_worker()
    got = await register(api, {"url": sick.url, "health": {"disable_health_check": False}})
    await Worker.objects.filter(pk=got["id"]).aupdate(status=WorkerStatus.NOT_READY)
    await api.delete(f"/workers/{got['id']}")

    async def removed() -> bool:
        return (await api.get(f"/workers/{got['id']}")).status_code == 404

    await until(removed, timeout=2)


async def test_health_checks_move_a_worker_through_its_states(api, fleet, start_worker) -> None:
    target = await start_worker()
    got = await register(api, {"url": target.url})
    target.state.health_status = 503  # the mock now fails its health probes (/_mock/faults in-process)

    async def not_ready() -> bool:
        return (await api.get(f"/workers/{got['id']}")).json()["status"] == "not_ready"

    await until(not_ready)
    await snapshot_reaches(lambda: not REGISTRY.snapshot.routable)
    target.state.health_status = 200

    async def ready() -> bool:
        return (await api.get(f"/workers/{got['id']}")).json()["status"] == "ready"

    await until(ready)
    await snapshot_reaches(lambda: bool(REGISTRY.snapshot.routable))


async def test_disable_health_check_makes_the_worker_ready_at_once(api, fleet, worker) -> None:
    got = await register(api, {"url": worker.url, "health": {"disable_health_check": True}})
    assert got["status"] == "ready"


async def test_added_worker_is_routed_by_the_data_plane(api, fleet, worker, make_gateway) -> None:
    await register(api, {"url": worker.url, "models": [{"id": "served", "aliases": ["nick"]}]})
    await snapshot_reaches(lambda: REGISTRY.snapshot.routable_models == ("served",))
    client = make_gateway(list(h.record for h in REGISTRY.snapshot.workers), model_aliases=(("nick", "served"),))
    response = await client.post("/v1/chat/completions", json={"model": "nick", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 200
    assert worker.requests()[-1]["json"]["model"] == "served"

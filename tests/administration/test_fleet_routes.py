"""/flush_cache, /get_loads, /start_profile, /stop_profile (admin) and /get_model_info,
/get_server_info, /health_generate, /engine_metrics (public), through the whole ASGI application in
front of real mock workers."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator, Iterator

import httpx
import pytest

from administration.control_auth import reset_control_plane_auth
from administration.registry_sync import RegistrySync
from common.config import current_config
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerRecord
from tests.conftest import GatewayFactory, RunningWorker, WorkerFactory, record_for

ADMIN_KEY = "sk-cp-admin-1"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CONTROL_PLANE = {"control_plane_api_keys": (("k1", "ops", "admin", ADMIN_KEY),)}


@pytest.fixture(autouse=True)
def fresh_control_plane_auth() -> Iterator[None]:
    reset_control_plane_auth()
    yield
    reset_control_plane_auth()


def posted(worker: RunningWorker, path: str) -> list[dict]:
    return [r for r in worker.requests() if r["path"] == path]


# --- /flush_cache ----------------------------------------------------------------------------------


async def test_flush_cache_reaches_every_worker_with_its_key(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    one = await start_worker(api_key="sk-one")
    two = await start_worker()
    gateway = make_gateway([record_for(one, api_key="sk-one"), record_for(two, status="not_ready")])
    response = await gateway.post("/flush_cache")
    assert response.status_code == 200
    assert response.json() == {
        "status": "success",
        "message": "Cache flushed on 2 workers",
        "workers_flushed": 2,
        "total_http_workers": 2,
        "total_grpc_workers": 0,
        "total_zmq_workers_skipped": 0,
        "total_workers": 2,
    }
    assert posted(one, "/flush_cache")[0]["headers"]["authorization"] == "Bearer sk-one"
    assert "authorization" not in posted(two, "/flush_cache")[0]["headers"]


async def test_flush_cache_with_a_failing_worker_is_206(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    good, bad = await start_worker(), await start_worker()
    bad.state.flush_status = 500
    response = await make_gateway([record_for(good), record_for(bad)]).post("/flush_cache")
    assert response.status_code == 206
    body = response.json()
    assert body["status"] == "partial_success" and body["workers_flushed"] == 1 and body["total_workers"] == 2
    assert body["successful"] == [good.url]
    assert [f["worker"] for f in body["failed"]] == [bad.url] and "500" in body["failed"][0]["error"]


async def test_flush_cache_all_failing_is_206_too(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    worker.state.flush_status = 503
    response = await make_gateway([record_for(worker)]).post("/flush_cache")
    assert response.status_code == 206 and response.json()["successful"] == []


async def test_flush_cache_without_workers_is_200(make_gateway: GatewayFactory) -> None:
    response = await make_gateway([]).post("/flush_cache")
    assert response.status_code == 200
    assert response.json()["total_workers"] == 0 and response.json()["status"] == "success"


async def test_flush_cache_answers_only_post(make_gateway: GatewayFactory) -> None:
    assert (await make_gateway([]).get("/flush_cache")).status_code == 405


# --- control-plane auth ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/flush_cache"), ("GET", "/get_loads"), ("POST", "/start_profile"), ("POST", "/stop_profile")],
)
async def test_admin_routes_need_a_control_plane_credential(
    make_gateway: GatewayFactory, worker: RunningWorker, method: str, path: str
) -> None:
    gateway = make_gateway([record_for(worker)], **CONTROL_PLANE)
    denied = await gateway.request(method, path)
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "unauthorized"
    wrong = await gateway.request(method, path, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    allowed = await gateway.request(method, path, headers=ADMIN)
    assert allowed.status_code == 200, allowed.text


async def test_a_non_admin_role_is_403(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway([], control_plane_api_keys=(("k2", "viewer", "user", "sk-viewer"),))
    response = await gateway.post("/flush_cache", headers={"Authorization": "Bearer sk-viewer"})
    assert response.status_code == 403 and response.json()["error"]["type"] == "forbidden"


async def test_public_routes_need_no_credential(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)], **CONTROL_PLANE)
    for path in ("/loads", "/get_model_info", "/get_server_info", "/health_generate", "/engine_metrics"):
        assert (await gateway.get(path)).status_code == 200, path


async def test_get_loads_is_the_loads_body(make_gateway: GatewayFactory) -> None:
    body = (await make_gateway([], **CONTROL_PLANE).get("/get_loads", headers=ADMIN)).json()
    assert body["loads"] == [] and body["dp_rank_count"] == 0 and body["version"].startswith("gateway-")


# --- profiling -----------------------------------------------------------------------------------


async def test_start_profile_passes_its_options_to_every_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    workers = [await start_worker(), await start_worker()]
    gateway = make_gateway([record_for(w) for w in workers])
    options = {"output_dir": "/tmp/prof", "num_steps": 5, "activities": ["CPU", "GPU"], "with_stack": True, "extra": 1}
    response = await gateway.post("/start_profile", json=options)
    assert response.status_code == 200
    assert response.json()["status"] == "success" and sorted(response.json()["successful"]) == sorted(w.url for w in workers)
    for worker in workers:
        (sent,) = posted(worker, "/start_profile")
        assert sent["json"] == {"output_dir": "/tmp/prof", "num_steps": 5, "activities": ["CPU", "GPU"], "with_stack": True}
    assert (await gateway.post("/stop_profile")).status_code == 200
    assert all(len(posted(w, "/stop_profile")) == 1 for w in workers)


async def test_profile_url_restricts_to_one_worker(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    chosen, other = await start_worker(), await start_worker()
    gateway = make_gateway([record_for(chosen), record_for(other)])
    response = await gateway.post("/stop_profile", json={"url": chosen.url})
    assert response.status_code == 200 and response.json()["successful"] == [chosen.url]
    assert posted(chosen, "/stop_profile") and not posted(other, "/stop_profile")


async def test_profile_with_no_matching_worker_is_404(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)])
    response = await gateway.post("/start_profile", json={"url": "http://127.0.0.1:1"})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    assert (await make_gateway([]).post("/stop_profile")).status_code == 404


async def test_profile_partial_failure_is_206(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    good, bad = await start_worker(), await start_worker()
    bad.state.profile_status = 500
    response = await make_gateway([record_for(good), record_for(bad)]).post("/start_profile", json={})
    assert response.status_code == 206
    body = response.json()
    assert body["successful"] == [good.url] and [f["worker"] for f in body["failed"]] == [bad.url]


async def test_profile_body_that_is_not_json_is_400(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    response = await make_gateway([record_for(worker)]).post("/start_profile", content=b"{nope")
    assert response.status_code == 400 and response.json()["error"]["type"] == "bad_request"


# --- model and server information, /health_generate ---------------------------------------------------


async def test_model_and_server_info_come_from_the_first_healthy_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    pending = await start_worker(model="pending-model")
    ready = await start_worker(model="ready-model", api_key="sk-w")
    gateway = make_gateway([record_for(pending, status="pending"), record_for(ready, api_key="sk-w")])
    info = await gateway.get("/get_model_info")
    assert info.status_code == 200 and info.json()["model_path"] == "ready-model"
    server = await gateway.get("/get_server_info")
    assert server.status_code == 200 and server.json()["served_model_name"] == "ready-model"
    assert posted(ready, "/get_model_info")[0]["headers"]["authorization"] == "Bearer sk-w"
    assert not posted(pending, "/get_model_info")


async def test_server_info_of_an_engine_without_the_route_is_404(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    vllm = await start_worker(owned_by="vllm")
    assert (await make_gateway([record_for(vllm)]).get("/get_server_info")).status_code == 404


@pytest.mark.parametrize("path", ["/get_model_info", "/get_server_info", "/health_generate"])
async def test_forwarding_without_a_healthy_worker_is_503(
    make_gateway: GatewayFactory, worker: RunningWorker, path: str
) -> None:
    response = await make_gateway([record_for(worker, status="not_ready")]).get(path)
    assert response.status_code == 503
    assert response.headers["x-gw-error-code"] == "no_healthy_workers" and response.json()["error"]["code"] == "no_healthy_workers"


async def test_health_generate_passes_the_worker_answer_through(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    gateway = make_gateway([record_for(worker)])
    assert (await gateway.get("/health_generate")).status_code == 200
    worker.state.health_status = 503
    assert (await gateway.get("/health_generate")).status_code == 503
    assert len(posted(worker, "/health_generate")) == 2


# --- /engine_metrics ----------------------------------------------------------------------------------


async def test_engine_metrics_labels_every_sample_with_its_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    one, two = await start_worker(), await start_worker()
    down = await start_worker()
    down.state.metrics_status = 500
    gateway = make_gateway([record_for(one), record_for(two), record_for(down), record_for(one.url + "@1", model="m")])
    response = await gateway.get("/engine_metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert text.count("# TYPE sglang:num_requests_running gauge") == 1
    assert text.count("# HELP sglang:num_requests_running The number of running requests.") == 1
    for worker in (one, two):
        assert f'sglang:num_requests_running{{worker_addr="{worker.url}",model_name="mock-model",dp_rank="0"}} 0.0' in text
    assert down.url not in text
    assert len(posted(one, "/metrics")) == 1  # once per base URL
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all("worker_addr=" in line for line in samples)


async def test_engine_metrics_without_workers_or_scrapes_is_500(make_gateway: GatewayFactory, worker: RunningWorker) -> None:
    empty = await make_gateway([]).get("/engine_metrics")
    assert empty.status_code == 500 and empty.headers["content-type"].startswith("text/plain") and empty.text
    worker.state.metrics_status = 500
    failing = await make_gateway([record_for(worker)]).get("/engine_metrics")
    assert failing.status_code == 500 and "scrape" in failing.text


# --- gRPC and ZMQ deployments, HTTP PD mode ------------------------------------------------------------
# Records published directly (registered gRPC workers: tests/administration/test_grpc_workers.py).

INFO_PATHS = ["/get_model_info", "/get_server_info", "/health_generate"]


def grpc_record(status: str = "ready", worker_type: str = "regular") -> WorkerRecord:
    return dataclasses.replace(record_for("grpc://127.0.0.1:50051", model="m", status=status),
                               worker_type=worker_type)


def zmq_record(status: str = "ready") -> WorkerRecord:
    return record_for("ipc:///tmp/engine-0", model="m", status=status)


def typed(worker: RunningWorker, worker_type: str, status: str = "ready") -> WorkerRecord:
    return dataclasses.replace(record_for(worker, status=status), worker_type=worker_type)


@pytest.mark.parametrize("path", INFO_PATHS)
@pytest.mark.parametrize(
    ("records", "named"),
    [([grpc_record()], "gRPC"), ([zmq_record()], "ZMQ"), ([grpc_record(status="not_ready"), zmq_record()], "gRPC and ZMQ")],
)
async def test_grpc_and_zmq_deployments_are_501(
    make_gateway: GatewayFactory, path: str, records: list[WorkerRecord], named: str
) -> None:
    response = await make_gateway(records).get(path)
    assert response.status_code == 501
    assert response.headers["x-gw-error-code"] == "endpoint_not_supported"
    error = response.json()["error"]
    assert error["code"] == "endpoint_not_supported" and error["type"] == "not_implemented"
    assert path in error["message"] and f"{named} workers" in error["message"]


@pytest.mark.parametrize("path", INFO_PATHS)
async def test_an_http_worker_beside_grpc_ones_decides(make_gateway: GatewayFactory, worker: RunningWorker, path: str) -> None:
    served = await make_gateway([grpc_record(), record_for(worker)]).get(path)
    assert served.status_code == 200 and posted(worker, path)
    down = await make_gateway([grpc_record(), record_for(worker, status="not_ready")]).get(path)
    assert down.status_code == 503 and down.json()["error"]["code"] == "no_healthy_workers"


async def test_no_workers_at_all_is_503_not_501(make_gateway: GatewayFactory) -> None:
    for path in INFO_PATHS:
        assert (await make_gateway([]).get(path)).status_code == 503


@pytest.mark.parametrize("path", ["/get_model_info", "/get_server_info"])
async def test_pd_mode_asks_the_first_healthy_prefill_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, path: str
) -> None:
    decode = await start_worker(model="decode-model")
    pending = await start_worker(model="pending-prefill")
    prefill = await start_worker(model="prefill-model", api_key="sk-p")
    later = await start_worker(model="later-prefill")
    gateway = make_gateway([
        typed(decode, "decode"),
        typed(pending, "prefill", status="pending"),
        dataclasses.replace(typed(prefill, "prefill"), api_key="sk-p"),
        typed(later, "prefill"),
    ])
    response = await gateway.get(path)
    assert response.status_code == 200 and response.json()["model_path"] == "prefill-model"
    assert posted(prefill, path)[0]["headers"]["authorization"] == "Bearer sk-p"
    assert not posted(decode, path) and not posted(pending, path) and not posted(later, path)


@pytest.mark.parametrize("path", INFO_PATHS)
async def test_pd_mode_without_a_healthy_prefill_worker_is_503(
    make_gateway: GatewayFactory, start_worker: WorkerFactory, path: str
) -> None:
    prefill, decode = await start_worker(), await start_worker()
    gateway = make_gateway([typed(prefill, "prefill", status="not_ready"), typed(decode, "decode")])
    response = await gateway.get(path)
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_healthy_workers"
    assert not posted(decode, path)


async def test_a_fleet_with_regular_workers_is_not_in_pd_mode(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    regular = await start_worker(model="regular-model")
    prefill = await start_worker(model="prefill-model")
    gateway = make_gateway([typed(prefill, "prefill"), record_for(regular)])
    assert (await gateway.get("/get_model_info")).json()["model_path"] == "regular-model"
    assert (await gateway.get("/health_generate")).status_code == 200
    assert not posted(prefill, "/get_model_info") and not posted(prefill, "/health_generate")
    # Regular workers registered but none healthy: 503, not a switch to the prefill worker.
    down = make_gateway([typed(prefill, "prefill"), record_for(regular, status="not_ready")])
    assert (await down.get("/get_model_info")).status_code == 503


async def test_health_generate_in_pd_mode_checks_a_prefill_and_a_decode_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    prefill, decode = await start_worker(), await start_worker(api_key="sk-d")
    spare = await start_worker()
    gateway = make_gateway([
        typed(prefill, "prefill"), dataclasses.replace(typed(decode, "decode"), api_key="sk-d"), typed(spare, "decode"),
    ])
    assert (await gateway.get("/health_generate")).status_code == 200
    assert len(posted(prefill, "/health_generate")) == 1 and len(posted(decode, "/health_generate")) == 1
    assert posted(decode, "/health_generate")[0]["headers"]["authorization"] == "Bearer sk-d"
    assert not posted(spare, "/health_generate")
    decode.state.health_status = 503
    failed = await gateway.get("/health_generate")
    assert failed.status_code == 503 and "unhealthy" in failed.text
    decode.state.health_status, prefill.state.health_status = 200, 500
    assert (await gateway.get("/health_generate")).status_code == 500


async def test_health_generate_in_pd_mode_needs_a_healthy_decode_worker(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    prefill, decode = await start_worker(), await start_worker()
    gateway = make_gateway([typed(prefill, "prefill"), typed(decode, "decode", status="not_ready")])
    response = await gateway.get("/health_generate")
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_healthy_workers"
    assert not posted(prefill, "/health_generate")


async def test_flush_cache_reaches_prefill_and_decode_workers_and_counts_other_transports(
    make_gateway: GatewayFactory, start_worker: WorkerFactory
) -> None:
    prefill, decode = await start_worker(), await start_worker()
    gateway = make_gateway([typed(prefill, "prefill"), typed(decode, "decode"), grpc_record(), zmq_record()])
    response = await gateway.post("/flush_cache")
    assert response.status_code == 206  # nothing listens at the gRPC worker's address: reported failed
    body = response.json()
    assert sorted(body["successful"]) == sorted([prefill.url, decode.url])
    assert (body["total_http_workers"], body["total_grpc_workers"], body["total_zmq_workers_skipped"]) == (2, 1, 1)
    assert posted(prefill, "/flush_cache") and posted(decode, "/flush_cache")


@pytest.fixture
async def gateway_with_fleet(make_gateway: GatewayFactory) -> AsyncIterator[httpx.AsyncClient]:
    """The in-process gateway with its real control plane: registration jobs, health checks and the
    fleet loop publishing the registry from the store."""
    client = make_gateway([], worker_startup_check_interval=0.2, health_check_interval_secs=0.2)
    fleet = RegistrySync(current_config())
    await fleet.astart()
    yield client
    await fleet.astop()


async def _register_ready(gateway: httpx.AsyncClient, body: dict) -> None:
    response = await gateway.post("/workers", json=body)
    assert response.status_code == 202, response.text
    location = response.json()["location"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while loop.time() < deadline:
        got = await gateway.get(location)
        if got.status_code == 200 and got.json()["status"] == "ready" and "job_status" not in got.json():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{body['url']} not ready in time")


@pytest.mark.django_db(transaction=True)
async def test_workers_registered_as_prefill_and_decode_put_the_routes_in_pd_mode(
    gateway_with_fleet: httpx.AsyncClient, start_worker: WorkerFactory
) -> None:
    decode, prefill = await start_worker(model="pd-model"), await start_worker(model="pd-model")
    await _register_ready(gateway_with_fleet, {"url": decode.url, "worker_type": "decode"})
    await _register_ready(gateway_with_fleet, {"url": prefill.url, "worker_type": "prefill"})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while len([h for h in REGISTRY.snapshot.workers if h.record.status == "ready"]) < 2:  # the fleet loop's refresh
        assert loop.time() < deadline, "registry not refreshed"
        await asyncio.sleep(0.05)
    for worker in (decode, prefill):
        worker.state.requests.clear()  # registration probed them too
    info = await gateway_with_fleet.get("/get_model_info")
    assert info.status_code == 200 and info.json()["model_path"] == "pd-model"
    assert posted(prefill, "/get_model_info") and not posted(decode, "/get_model_info")
    assert (await gateway_with_fleet.get("/health_generate")).status_code == 200
    assert posted(prefill, "/health_generate") and posted(decode, "/health_generate")

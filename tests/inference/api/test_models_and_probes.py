"""GET /v1/models and the probes."""

from __future__ import annotations

from tests.conftest import RunningWorker, record_for


async def test_models_lists_each_model_once_without_aliases(make_gateway, start_worker) -> None:
    a1, a2, b = await start_worker(model="llama"), await start_worker(model="llama"), await start_worker(model="qwen")
    client = make_gateway([record_for(a1), record_for(a2), record_for(b)], model_aliases=(("fast", "llama"),))
    response = await client.get("/v1/models")
    assert response.status_code == 200
    assert response.json() == {
        "object": "list",
        "data": [
            {"id": "llama", "object": "model", "created": 0, "owned_by": "self_hosted"},
            {"id": "qwen", "object": "model", "created": 0, "owned_by": "self_hosted"},
        ],
    }


async def test_models_without_any_model_is_503_plain_text(make_gateway) -> None:
    response = await make_gateway([]).get("/v1/models")
    assert response.status_code == 503
    assert response.text == "No models available"
    assert response.headers["content-type"].startswith("text/plain")


async def test_models_leaves_out_workers_that_are_not_ready(make_gateway, worker: RunningWorker) -> None:
    response = await make_gateway([record_for(worker, status="pending")]).get("/v1/models")
    assert response.status_code == 503


async def test_liveness_and_health(gateway) -> None:
    for path in ("/health", "/liveness"):
        response = await gateway.get(path)
        assert response.status_code == 200 and response.json() == {"status": "ok"}


async def test_readiness_with_a_routable_worker(gateway) -> None:
    response = await gateway.get("/readiness")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "workers": {"ready": 1, "total": 1}}


async def test_readiness_without_routable_worker_is_503(make_gateway, worker: RunningWorker) -> None:
    response = await make_gateway([record_for(worker, status="pending")]).get("/readiness")
    assert response.status_code == 503
    assert response.json()["status"] == "not_ready"


async def test_liveness_does_not_depend_on_workers(make_gateway) -> None:
    assert (await make_gateway([]).get("/liveness")).status_code == 200


async def test_readiness_is_503_while_draining(gateway) -> None:
    from inference.dataplane import data_plane

    assert (await gateway.get("/readiness")).status_code == 200
    data_plane().draining = True
    response = await gateway.get("/readiness")
    assert response.status_code == 503 and response.json()["status"] == "draining"
    assert (await gateway.get("/liveness")).status_code == 200

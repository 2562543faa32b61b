"""The worker fleet across processes: jobs through a real Celery broker and worker, and several
gateway processes sharing one store and one Redis channel layer."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.embedded]  # also in CI's SQLite pass

REDIS = "redis://127.0.0.1:6379"
MESSAGES = [{"role": "user", "content": "hello"}]


def _redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS, socket_connect_timeout=1).ping())
    except Exception:
        return False


needs_redis = pytest.mark.skipif(not _redis_up() and not os.environ.get("CI"), reason="no Redis on 127.0.0.1:6379")


def _shared_env() -> dict[str, str]:
    db = str(1 + uuid.uuid4().int % 14)
    return {
        "REDIS_URL": f"{REDIS}/{db}",
        "GW_HEALTH_CHECK_INTERVAL_SECS": "0.5",
        "GW_WORKER_STARTUP_CHECK_INTERVAL": "0.5",
    }


def _register(gateway_url: str, worker_url: str) -> str:
    response = httpx.post(f"{gateway_url}/workers", json={"url": worker_url})
    assert response.status_code == 202, response.text
    return response.json()["worker_id"]


def _is_ready(gateway_url: str, worker_id: str) -> bool:
    response = httpx.get(f"{gateway_url}/workers/{worker_id}")
    return response.status_code == 200 and response.json()["status"] == "ready"


@needs_redis
def test_worker_added_through_one_gateway_is_routed_by_another(spawn, mock_worker_process) -> None:
    env = _shared_env()
    first = spawn("gateway-a", _gateway_args(port_a := free_port()), port_a, ready_path="/liveness", env=env)
    second = spawn("gateway-b", _gateway_args(port_b := free_port()), port_b, ready_path="/liveness", env=env)
    worker_id = _register(first.url, mock_worker_process.url)
    wait_for(lambda: _is_ready(first.url, worker_id), 30, "worker ready")
    wait_for(lambda: httpx.get(second.url + "/readiness").status_code == 200, 30, "second gateway ready")
    client = openai.OpenAI(base_url=second.url + "/v1", api_key="x", _strict_response_validation=True, max_retries=0)
    reply = client.chat.completions.create(model="mock-model", messages=MESSAGES)
    assert reply.choices[0].message.content
    # And removal through the second is seen by the first.
    assert httpx.delete(f"{second.url}/workers/{worker_id}").status_code == 202
    wait_for(lambda: httpx.get(first.url + "/readiness").status_code == 503, 30, "first gateway sees the removal")


@needs_redis
def test_jobs_run_on_a_celery_worker_through_the_broker(spawn, mock_worker_process) -> None:
    env = {**_shared_env(), "CELERY_BROKER_URL": f"{REDIS}/15"}
    celery = spawn(
        "celery",
        [],
        None,
        env=env,
        argv=[str(Path(sys.executable).parent / "celery"), "-A", "gateway_project", "worker", "--pool", "threads",
              "--concurrency", "4", "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
    )
    wait_for(lambda: "ready." in celery.log(), 60, "celery worker ready")
    gateway = spawn("gateway", _gateway_args(port := free_port()), port, ready_path="/liveness", env=env)
    worker_id = _register(gateway.url, mock_worker_process.url)
    wait_for(lambda: _is_ready(gateway.url, worker_id), 30, "worker registered by the Celery worker")
    assert "administration.run_job" in celery.log() and "registered: runtime sglang" in celery.log()
    assert "registered: runtime" not in gateway.log()  # the gateway did not run the job itself
    reply = httpx.post(gateway.url + "/v1/chat/completions", json={"model": "mock-model", "messages": MESSAGES})
    assert reply.status_code == 200


def _gateway_args(port: int) -> list[str]:
    return ["rungateway", "--host", "127.0.0.1", "--port", str(port)]

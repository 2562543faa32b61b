"""Secrets never leave the gateway: one gateway process at debug log level holding every kind of
secret (the shared key, which command-line workers are also given, a tenant key, a control-plane
key, a worker key registered through the API and a wrong one that the worker refuses), driven through
success and the failures that involve them.
Then its whole log, its metrics, every admin read and the admin console pages are searched for them."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Callable

import httpx
import pytest

from tests.e2e.browser import PASSWORD, USERNAME, make_staff_user
from tests.e2e.conftest import ROOT, Process, free_port, wait_for

pytestmark = pytest.mark.e2e

SHARED = "sk-sweep-shared-1b7e90"
TENANT = "sk-sweep-tenant-44c2d1"
ADMIN = "sk-sweep-admin-9f01aa"
API_WORKER_KEY = "sk-sweep-apiworker-d3c8"
WRONG_WORKER_KEY = "sk-sweep-wrongworker-0a4f"
SECRETS = (SHARED, TENANT, ADMIN, API_WORKER_KEY, WRONG_WORKER_KEY)
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}


def _worker(spawn: Callable[..., Process], name: str, key: str) -> Process:
    port = free_port()
    return spawn(name, ["runmockworker", "--host", "127.0.0.1", "--port", str(port), "--model", "mock-model",
                        "--api-key", key], port)


def test_no_secret_appears_in_logs_errors_metrics_or_admin_reads(spawn: Callable[..., Process]) -> None:
    cli_worker = _worker(spawn, "worker-cli", SHARED)  # command-line workers are sent --api-key
    api_worker = _worker(spawn, "worker-api", API_WORKER_KEY)
    refusing = _worker(spawn, "worker-refusing", "sk-sweep-not-what-the-gateway-sends")
    port, metrics_port = free_port(), free_port()
    gateway = spawn(
        "gateway-sweep",
        ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--log-level", "debug",
         "--worker-urls", cli_worker.url, "--api-key", SHARED, "--tenant-api-key", f"acme:{TENANT}",
         "--control-plane-api-keys", f"ops:operator:admin:{ADMIN}", "--prometheus-port", str(metrics_port),
         "--health-check-interval-secs", "0.3", "--health-success-threshold", "1",
         "--worker-startup-check-interval", "0.3"],
        port,
        ready_path="/liveness",
    )
    admin = {"Authorization": f"Bearer {ADMIN}"}
    created = httpx.post(gateway.url + "/workers", headers=admin,
                         json={"url": api_worker.url, "api_key": API_WORKER_KEY, "labels": {"zone": "a"}})
    assert created.status_code == 202
    worker_id = created.json()["worker_id"]
    # A worker registered with a key it refuses: discovery gets 401 and the job fails with a message.
    refused = httpx.post(gateway.url + "/workers", headers=admin, json={"url": refusing.url, "api_key": WRONG_WORKER_KEY})
    assert refused.status_code == 202
    refused_at = gateway.url + f"/workers/{refused.json()['worker_id']}"
    wait_for(lambda: httpx.get(refused_at, headers=admin).status_code == 404, 30, "refused worker released", gateway)
    wait_for(lambda: len(httpx.get(gateway.url + "/workers", headers=admin).json()["workers"]) == 2, 30,
             "command-line and API workers registered", gateway)
    wait_for(lambda: httpx.get(gateway.url + "/readiness").status_code == 200, 30, "workers routable", gateway)

    answers: list[httpx.Response] = []
    for key in (SHARED, TENANT, "sk-wrong", ADMIN):
        answers.append(httpx.post(gateway.url + "/v1/chat/completions", json=CHAT,
                                  headers={"Authorization": f"Bearer {key}"}))
    assert [r.status_code for r in answers] == [200, 200, 401, 401]
    answers.append(httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, "model": "nope"},
                              headers={"Authorization": f"Bearer {TENANT}"}))
    # Control plane: a tenant key and the wrong key are refused; reads with the admin key.
    answers.append(httpx.get(gateway.url + "/workers", headers={"Authorization": f"Bearer {TENANT}"}))
    answers.append(httpx.get(gateway.url + "/workers", headers={"Authorization": f"Bearer {SHARED}x"}))
    listing = httpx.get(gateway.url + "/workers", headers=admin)
    answers.append(listing)
    answers.append(httpx.get(gateway.url + f"/workers/{worker_id}", headers=admin))
    answers.append(httpx.patch(gateway.url + f"/workers/{worker_id}", headers=admin, json={"api_key": 5}))
    answers.append(httpx.get(gateway.url + "/loads"))
    answers.append(httpx.get(gateway.url + "/get_loads", headers=admin))
    answers.append(httpx.get(gateway.url + "/engine_metrics"))
    answers.append(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics"))
    assert any(w["url"] == api_worker.url for w in listing.json()["workers"])
    assert [r.status_code for r in answers[4:7]] == [404, 401, 401]

    make_staff_user(gateway)
    console = httpx.Client(base_url=gateway.url, follow_redirects=True)
    login = console.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)
    assert token is not None
    console.post("/admin/login/", data={"username": USERNAME, "password": PASSWORD,
                                         "csrfmiddlewaretoken": token.group(1), "next": "/admin/"})
    pages = [console.get(path) for path in (
        "/admin/", "/admin/administration/worker/", f"/admin/administration/worker/{worker_id}/change/",
        "/admin/administration/worker/fleet/", "/admin/administration/worker/fleet/data/",
        "/admin/administration/worker/add/",
    )]
    assert all(page.status_code == 200 for page in pages), [p.status_code for p in pages]
    assert API_WORKER_KEY not in pages[2].text and "zone" in pages[2].text  # the worker's page did render

    listed_cli = subprocess.run([sys.executable, "manage.py", "list_workers"], cwd=ROOT,
                                env=gateway.env, capture_output=True, text=True, timeout=60)
    gateway.stop()  # flush the log, including shutdown
    texts = {
        "log": gateway.log(),
        "list_workers": listed_cli.stdout + listed_cli.stderr,
        **{f"answer {i} ({r.request.method} {r.request.url.path})": r.text + repr(dict(r.headers))
           for i, r in enumerate(answers)},
        **{f"page {p.request.url.path}": p.text for p in pages},
    }
    assert "registered: runtime" in texts["log"] and "refused" in texts["log"]  # the log did record the jobs
    leaks = [(where, secret) for where, text in texts.items() for secret in SECRETS if secret in text]
    assert not leaks, leaks

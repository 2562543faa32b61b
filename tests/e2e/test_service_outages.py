"""The services the gateway depends on, cut under traffic: Postgres, Redis and the broker, each behind
a fault proxy of ours (tests/faults.py) that resets every connection and refuses new ones, then
restored. A real gateway process, a real stand-in worker, real traffic throughout.

What must hold: the data plane answers every request from its snapshot; control routes that need
the store answer 503 in their envelope within seconds, never 500, and recover by themselves; a job
whose broker is down runs in the gateway and leaves no record that blocks its URL; rate limits
count in the process while Redis is gone; each outage is logged once when it starts and once when
it ends, with no traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from common.outages import BROKER
from tests.e2e.conftest import ROOT, Process, free_port, wait_for
from tests.e2e.test_fleet_processes import REDIS, needs_redis
from tests.faults import FaultProxy
from tests.redis_server import RedisServer, needs_redis_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # about 45 s; the same on either store: one CI pass

POSTGRES = "postgres://postgres@127.0.0.1:5432"
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
ANSWERED_WITHIN = 10.0  # seconds: "within a few seconds", generously (the pool waits 3 s for a connection)
RECOVERED_WITHIN = 30.0


def _postgres_up() -> bool:
    try:
        import psycopg

        with psycopg.connect(f"{POSTGRES}/postgres", connect_timeout=2):
            return True
    except Exception:
        return False


needs_postgres = pytest.mark.skipif(not _postgres_up() and not os.environ.get("CI"),
                                    reason="no Postgres on 127.0.0.1:5432")


@pytest.fixture
def outage_database() -> Iterator[str]:
    """A migrated Postgres database of this test only; its URL (direct, not through a proxy)."""
    import psycopg

    name = f"gw_outage_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{POSTGRES}/{name}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "gateway_project.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True,
                   timeout=120)
    try:
        yield url
    finally:
        with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Traffic:
    """Chat completions sent one after another on a thread until stopped; every status kept."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.headers = headers or {}
        self.statuses: list[int | str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    answer = client.post(self.url + "/v1/chat/completions", json=CHAT, headers=self.headers)
                    self.statuses.append(answer.status_code)
                except httpx.HTTPError as exc:  # counted as a failure, not hidden
                    self.statuses.append(type(exc).__name__)
                time.sleep(0.02)

    @contextmanager
    def running(self) -> Iterator[Traffic]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=30)


def _timed(call: Callable[[], httpx.Response]) -> httpx.Response:
    started = time.monotonic()
    response = call()
    took = time.monotonic() - started
    assert took < ANSWERED_WITHIN, f"{response.request.method} {response.request.url} took {took:.1f} s"
    return response


def _gateway(spawn: Callable[..., Process], env: dict[str, str], *flags: str) -> Process:
    port = free_port()
    args = ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--health-check-interval-secs", "0.5",
            "--worker-startup-check-interval", "0.5", *flags]
    return spawn(f"gateway-{port}", args, port, ready_path="/liveness", env=env)


def _register(gateway: Process, url: str) -> str:
    answer = _timed(lambda: httpx.post(gateway.url + "/workers", json={"url": url}, timeout=30))
    assert answer.status_code == 202, answer.text
    worker_id: str = answer.json()["worker_id"]
    return worker_id


def _ready(gateway: Process, worker_id: str) -> bool:
    answer = httpx.get(f"{gateway.url}/workers/{worker_id}", timeout=30)
    assert answer.status_code != 500, answer.text
    return answer.status_code == 200 and answer.json().get("status") == "ready"


def _outage_lines(log: str, service: str) -> tuple[int, int]:
    """How many times ``service``'s outage was logged as started and as ended in a process's ``log``."""
    return log.count(f"{service} unavailable ("), log.count(f"{service} reachable again after")


def _csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


@needs_postgres
def test_postgres_cut_under_traffic(spawn, mock_worker_process, outage_database, tmp_path: Path) -> None:
    with FaultProxy("127.0.0.1", 5432) as store:
        database = urlsplit(outage_database)._replace(netloc=f"postgres@127.0.0.1:{store.port}").geturl()
        env = {"DATABASE_URL": database, "GW_ADMIN_USERNAME": "outage-admin", "GW_ADMIN_PASSWORD": "outage-Passw0rd!"}
        made = subprocess.run([sys.executable, "manage.py", "ensure_admin"], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "DJANGO_SETTINGS_MODULE": "gateway_project.settings",
                                   "GW_DATA_DIR": str(tmp_path / "data"), **env}, timeout=60)
        assert made.returncode == 0, made.stderr
        gateway = _gateway(spawn, env)
        worker_id = _register(gateway, mock_worker_process.url)
        wait_for(lambda: _ready(gateway, worker_id), RECOVERED_WITHIN, "worker ready", gateway)
        console = httpx.Client(base_url=gateway.url, timeout=30)
        login = {"username": "outage-admin", "password": "outage-Passw0rd!", "next": "/admin/"}
        login["csrfmiddlewaretoken"] = _csrf(console.get("/admin/login/"))
        # A blip (Postgres restarted between two requests): the pooled connection it killed is checked
        # and replaced, so the next request is answered, not failed with a 500.
        store.cut()
        store.restore()
        after_blip = httpx.get(gateway.url + "/workers", timeout=30)
        assert after_blip.status_code == 200, after_blip.text
        time.sleep(0.5)
        start = len(gateway.log())  # a background read caught by the blip is an outage of its own

        late_port = free_port()  # a worker that comes up only during the outage
        late_id = _register(gateway, f"http://127.0.0.1:{late_port}")  # its job probes it meanwhile

        with Traffic(gateway.url).running() as traffic:
            time.sleep(0.5)
            store.cut()
            time.sleep(1.0)  # the background loops and the job run into it too
            listing = _timed(lambda: httpx.get(gateway.url + "/workers", timeout=30))
            one = _timed(lambda: httpx.get(f"{gateway.url}/workers/{worker_id}", timeout=30))
            created = _timed(lambda: httpx.post(gateway.url + "/workers", json={"url": "http://127.0.0.1:9"},
                                                timeout=30))
            page = _timed(lambda: console.get("/admin/login/"))
            signed_in = _timed(lambda: console.post("/admin/login/", data=login))
            loads = _timed(lambda: httpx.get(gateway.url + "/get_loads", timeout=30))
            spawn("late-worker", ["runmockworker", "--host", "127.0.0.1", "--port", str(late_port), "--model",
                                  "mock-model"], late_port)
            time.sleep(1.0)
            store.restore()
            # Recovered by itself: never a 500 on the way (a dead pooled connection is checked and replaced).
            wait_for(lambda: _ready(gateway, worker_id), RECOVERED_WITHIN, "GET /workers/{id} after the store returned")
            # The registration stored before the cut was not lost: its job waited the outage out.
            wait_for(lambda: _ready(gateway, late_id), RECOVERED_WITHIN, "the late worker registered", gateway)
            listed = httpx.get(gateway.url + "/workers", timeout=30)
            second_id = _register(gateway, f"http://localhost:{urlsplit(mock_worker_process.url).port}")
            wait_for(lambda: _ready(gateway, second_id), RECOVERED_WITHIN, "a worker registered after the outage",
                     gateway)
            login["csrfmiddlewaretoken"] = _csrf(console.get("/admin/login/"))
            signed_in_after = console.post("/admin/login/", data=login)
            time.sleep(0.5)
        log = gateway.log()[start:]  # before the proxy closes (another outage)

    for answer in (listing, one, created):
        assert answer.status_code == 503, answer.text
        assert answer.json() == {"error": "The gateway's store is unavailable; try again shortly",
                                 "code": "SERVICE_UNAVAILABLE"}
        assert answer.headers["retry-after"] == "5"
    for answer in (page, signed_in):
        assert answer.status_code == 503 and answer.headers["content-type"].startswith("text/plain"), answer.text
        assert "store is unavailable" in answer.text
    assert loads.status_code == 200  # the fan-out routes work from the snapshot
    assert listed.status_code == 200 and [w["id"] for w in listed.json()["workers"]] == [worker_id, late_id]
    assert signed_in_after.status_code == 302, signed_in_after.text  # the console signs in again
    assert traffic.statuses and set(traffic.statuses) == {200}, traffic.statuses  # the data plane never noticed
    assert _outage_lines(log, "the store (database)") == (1, 1), log
    assert "Traceback" not in log


@needs_redis
def test_broker_cut_runs_jobs_in_the_gateway(spawn, mock_worker_process) -> None:
    queue = f"{REDIS}/12"
    celery = spawn(
        "celery", [], None, env={"CELERY_BROKER_URL": queue},
        argv=[str(Path(sys.executable).parent / "celery"), "-A", "gateway_project", "worker", "--pool", "threads",
              "--concurrency", "2", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
              "--without-heartbeat"],
    )
    wait_for(lambda: "ready." in celery.log(), 60, "celery worker ready")
    with FaultProxy("127.0.0.1", 6379) as broker:
        gateway = _gateway(spawn, {"CELERY_BROKER_URL": broker.url("redis", "/12")})
        through_broker = _register(gateway, mock_worker_process.url)
        wait_for(lambda: _ready(gateway, through_broker), RECOVERED_WITHIN, "worker registered by Celery", gateway)
        assert f"worker {mock_worker_process.url} registered" in celery.log()

        other_url = f"http://localhost:{urlsplit(mock_worker_process.url).port}"
        with Traffic(gateway.url).running() as traffic:
            broker.cut()
            in_gateway = _register(gateway, other_url)  # 202, not 500: the job runs in the gateway
            wait_for(lambda: _ready(gateway, in_gateway), RECOVERED_WITHIN, "worker registered in the gateway", gateway)
            removal = _timed(lambda: httpx.delete(f"{gateway.url}/workers/{in_gateway}", timeout=30))
            assert removal.status_code == 202, removal.text
            wait_for(lambda: httpx.get(f"{gateway.url}/workers/{in_gateway}").status_code == 404, RECOVERED_WITHIN,
                     "worker removed in the gateway", gateway)
            broker.restore()
            time.sleep(BROKER.retry_secs)  # the gateway tries the broker again this long after its last failure
            again = _register(gateway, other_url)  # the URL is free, and its job goes through the broker again
            wait_for(lambda: _ready(gateway, again), RECOVERED_WITHIN, "worker registered by Celery again", gateway)
        log = gateway.log()  # before the proxy closes (another outage)

    assert f"worker {other_url} registered" in log  # during the cut
    assert f"worker {other_url} registered" in celery.log()  # after it
    assert traffic.statuses and set(traffic.statuses) == {200}, traffic.statuses
    assert _outage_lines(log, "the Celery broker") == (1, 1), log
    assert "Traceback" not in log


@needs_redis
def test_redis_cut_keeps_limits_in_the_process(spawn, mock_worker_process) -> None:
    run = uuid.uuid4().hex[:8]  # tenants of this run only: their counts in Redis cannot meet another run's
    limited_key, free_key = f"sk-outage-{run}-limited", f"sk-outage-{run}-free"
    headers = {"Authorization": f"Bearer {limited_key}"}
    with FaultProxy("127.0.0.1", 6379) as redis:
        gateway = _gateway(spawn, {"REDIS_URL": redis.url("redis", f"/{1 + uuid.uuid4().int % 14}")},
                           "--worker-urls", mock_worker_process.url, "--tenant-rate-limit", f"limited-{run}=3",
                           "--tenant-api-key", f"limited-{run}:{limited_key}",
                           "--tenant-api-key", f"free-{run}:{free_key}")
        wait_for(lambda: httpx.get(gateway.url + "/readiness").status_code == 200, RECOVERED_WITHIN, "ready", gateway)
        with Traffic(gateway.url, {"Authorization": f"Bearer {free_key}"}).running() as traffic:
            redis.cut()
            time.sleep(3.0)  # the notice listener would have logged three tracebacks by now
            with httpx.Client(timeout=30) as client:
                limited = []
                for _ in range(5):
                    limited.append(client.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers))
            redis.restore()
            wait_for(lambda: _outage_lines(gateway.log(), "Redis")[1] == 1, RECOVERED_WITHIN, "Redis seen back",
                     gateway)
            time.sleep(1.0)
        log = gateway.log()  # before the proxy closes (another outage)

    statuses = [answer.status_code for answer in limited]
    assert all(answer.headers.get("x-ratelimit-limit") == "3" for answer in limited), statuses
    if len({answer.headers["x-ratelimit-reset"] for answer in limited}) == 1:  # all in one minute's window
        assert statuses == [200, 200, 200, 429, 429]  # counted in the process: the limit held, open but not off
    assert traffic.statuses and set(traffic.statuses) == {200}, traffic.statuses
    assert _outage_lines(log, "Redis") == (1, 1), log
    assert "Traceback" not in log


@needs_redis_server
def test_redis_restart_gives_two_gateways_one_budget_again(
    spawn: Callable[..., Process], mock_worker_process: Process
) -> None:
    """Two gateway processes over a Redis of the test's own, killed and started again on its port
    (empty): once both have seen it back, a tenant's limit is one budget across them again (what each
    let through during the outage included), not 10 per process."""
    limit, key = 10, "sk-restart-limited"
    headers = {"Authorization": f"Bearer {key}"}
    with RedisServer() as redis_server:
        flags = ("--worker-urls", mock_worker_process.url, "--tenant-rate-limit", f"limited={limit}",
                 "--tenant-api-key", f"limited:{key}")
        gateways = [_gateway(spawn, {"REDIS_URL": redis_server.url()}, *flags) for _ in range(2)]
        for gateway in gateways:
            wait_for(lambda: httpx.get(gateway.url + "/readiness").status_code == 200, RECOVERED_WITHIN, "ready",
                     gateway)
        with httpx.Client(timeout=30) as client:

            def send(count: int) -> list[httpx.Response]:
                return [client.post(gateways[index % 2].url + "/v1/chat/completions", json=CHAT, headers=headers)
                        for index in range(count)]

            before = send(2)  # each gateway now holds a pooled connection Redis will drop
            redis_server.kill()
            during = send(4)
            redis_server.start()
            for gateway in gateways:
                wait_for(lambda: _outage_lines(gateway.log(), "Redis")[1] >= 1, RECOVERED_WITHIN, "Redis seen back",
                         gateway)
            after = send(2 * limit)
        logs = [gateway.log() for gateway in gateways]

    assert [r.headers["x-ratelimit-remaining"] for r in before] == ["9", "8"]  # one budget
    assert [r.status_code for r in during] == [200] * 4  # each counted alone: open, not refused
    decided = during + after
    remaining = [int(r.headers["x-ratelimit-remaining"]) for r in after]
    if len({r.headers["x-ratelimit-reset"] for r in decided}) == 1:  # the outage and after in one minute
        # Redis came back empty; the 2 + 2 the gateways let through meanwhile are added to it.
        assert [r.status_code for r in after] == [200] * (limit - 4) + [429] * (limit + 4)
        assert remaining == [7, 4, 3, 2, 1, 0] + [0] * (limit + 4)
    else:  # a new minute began on the way: it is counted once, by both
        last = [int(r.headers["x-ratelimit-remaining"]) for r in after
                if r.headers["x-ratelimit-reset"] == after[-1].headers["x-ratelimit-reset"]][:limit]
        assert last == list(range(limit - 1, limit - 1 - len(last), -1))
    for log in logs:
        assert _outage_lines(log, "Redis") == (1, 1), log
        assert "Traceback" not in log


@needs_postgres
def test_gateway_starts_while_the_store_is_down(spawn, mock_worker_process, outage_database) -> None:
    """Postgres refusing connections (our proxy, closed) as ``rungateway --workers 2 --worker-urls``
    starts (D79): it binds and answers /liveness, /readiness is 503 naming the store, the control
    plane answers 503 in its envelope, and the log says so once per serving process. Once the proxy
    opens, with no restart, the leader registers the command-line worker, both processes load the
    registry, /readiness is 200 and chat completions relay."""
    with FaultProxy("127.0.0.1", 5432) as store:
        store.cut()  # its port stays ours: restore() listens on it again
        database = urlsplit(outage_database)._replace(netloc=f"postgres@127.0.0.1:{store.port}").geturl()
        gateway = _gateway(spawn, {"DATABASE_URL": database}, "--workers", "2", "--worker-urls",
                           mock_worker_process.url)
        wait_for(lambda: gateway.log().count("started without the store") == 2, RECOVERED_WITHIN,
                 "both serving processes started", gateway)
        waiting = httpx.get(gateway.url + "/readiness", timeout=30)
        listing = _timed(lambda: httpx.get(gateway.url + "/workers", timeout=30))
        chat = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)

        store.restore()
        wait_for(lambda: gateway.log().count("registry loaded from the store") == 2, RECOVERED_WITHIN,
                 "both serving processes loaded the registry", gateway)
        wait_for(lambda: all(httpx.get(gateway.url + "/readiness").status_code == 200 for _ in range(4)),
                 RECOVERED_WITHIN, "ready", gateway)
        relayed = [httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30) for _ in range(6)]
        listed = httpx.get(gateway.url + "/workers", timeout=30)
        log = gateway.log()  # before the proxy closes (another outage)

    assert waiting.status_code == 503
    assert waiting.json() == {"status": "not_ready", "workers": {"ready": 0, "total": 0}, "waiting_for": "store"}
    assert listing.status_code == 503 and listing.json()["code"] == "SERVICE_UNAVAILABLE", listing.text
    assert chat.status_code != 500, chat.text
    assert [answer.status_code for answer in relayed] == [200] * 6, [answer.text for answer in relayed]
    assert [(w["url"], w["status"]) for w in listed.json()["workers"]] == [(mock_worker_process.url, "ready")]
    assert _outage_lines(log, "the store (database)") == (2, 2), log  # once per serving process
    assert log.count("waiting for the store") == 2, log
    assert "Traceback" not in log

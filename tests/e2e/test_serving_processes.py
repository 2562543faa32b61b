"""``rungateway --workers N``: one supervisor, N serving processes accepting on the one port.

Connections are pinned to a serving process by opening them until each process holds one (the owner
of a connection is read from /proc: the process whose descriptors include its socket), so every
process can be asked on its own: both answer, a worker added through one is routed by both, a
tenant's limit holds across them, a killed one is replaced while the other keeps serving, and
SIGTERM drains a long stream to its end before every process exits. The rolling restart of two
gateway instances on one store under steady load loses no request.
"""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Process, free_port, wait_for
from tests.e2e.test_fleet_processes import REDIS, needs_redis

pytestmark = pytest.mark.e2e

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


# --- which process holds a connection ------------------------------------------------------------
def serving_pids(supervisor: Process) -> list[int]:
    pid = supervisor.popen.pid
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        children.extend(int(child) for child in task.read_text().split())
    return sorted(children)


def _socket_inodes(local_port: int, remote_port: int) -> set[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.rsplit(":", 1)[1], 16) == local_port and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                found.add(fields[9])
    return found


def connection_owner(server_port: int, client_port: int, pids: list[int]) -> int | None:
    inodes = {f"socket:[{inode}]" for inode in _socket_inodes(server_port, client_port)}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in inodes:
                    return pid
            except OSError:
                continue
    return None


def _dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


class Pinned:
    """A keep-alive connection to the gateway, held by one serving process."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.connect()
        assert self.conn.sock is not None
        self.client_port = self.conn.sock.getsockname()[1]

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, bytes]:
        payload = orjson.dumps(body) if body is not None else None
        self.conn.request(method, path, body=payload, headers={"Content-Type": "application/json", **(headers or {})})
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.conn.close()


def pin_each(gateway: Process, port: int, pids: list[int]) -> dict[int, Pinned]:
    """One connection held by each serving process (others opened on the way are closed), each
    process ready (it sees the leader's health checks through the store within about a second).
    A process just forked accepts nothing until its start-up ends (seconds on a loaded machine), so
    connections are opened until a deadline rather than a count, pausing between rounds."""
    pinned: dict[int, Pinned] = {}
    spare: list[Pinned] = []
    deadline = time.monotonic() + 30
    opened = 0
    while len(pinned) < len(pids) and time.monotonic() < deadline:
        opened += 1
        if opened % 20 == 0:
            time.sleep(0.2)
        connection = Pinned(port)
        assert connection.request("GET", "/liveness")[0] == 200  # accepted and served by its process
        owner = connection_owner(port, connection.client_port, pids)
        if owner is not None and owner not in pinned:
            pinned[owner] = connection
        else:
            spare.append(connection)
        if len(spare) >= 100:  # bounded descriptors while a slow process starts
            for connection in spare:
                connection.close()
            spare.clear()
    for connection in spare:
        connection.close()
    assert set(pinned) == set(pids), f"connections reached {sorted(pinned)} of {pids}:\n{gateway.log()}"
    for pid, connection in pinned.items():
        wait_for(lambda: connection.request("GET", "/readiness")[0] == 200, 10, f"process {pid} ready", gateway)
    return pinned


@pytest.fixture
def start_supervised(spawn: Callable[..., Process]) -> Callable[..., tuple[Process, int]]:
    def start(*flags: str, server: str = "uvicorn", workers: int = 2, env: dict[str, str] | None = None) -> tuple[Process, int]:
        port = free_port()
        args = ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", server,
                "--workers", str(workers), "--prometheus-port", str(free_port()), *flags]
        gateway = spawn(f"gateway-{server}-x{workers}-{port}", args, port, ready_path="/readiness", env=env)
        wait_for(lambda: len(serving_pids(gateway)) == workers, 30, f"{workers} serving processes", gateway)
        for connection in pin_each(gateway, port, serving_pids(gateway)).values():  # every one ready
            connection.close()
        return gateway, port

    return start


# --- tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_both_processes_serve_and_a_worker_added_through_one_is_routed_by_both(
    start_supervised, spawn, mock_worker_process, server: str
) -> None:
    gateway, port = start_supervised("--worker-urls", mock_worker_process.url, server=server)
    pids = serving_pids(gateway)
    pinned = pin_each(gateway, port, pids)
    for connection in pinned.values():
        assert connection.request("POST", "/v1/chat/completions", CHAT)[0] == 200

    second_port = free_port()
    second = spawn("second-worker", ["runmockworker", "--host", "127.0.0.1", "--port", str(second_port),
                                     "--model", "second-model"], second_port)
    first = next(iter(pinned.values()))
    status, body = first.request("POST", "/workers", {"url": second.url})
    assert status == 202, body
    ask = {**CHAT, "model": "second-model"}
    for pid, connection in pinned.items():
        wait_for(lambda: connection.request("POST", "/v1/chat/completions", ask)[0] == 200, 20,
                 f"process {pid} routes second-model", gateway)
    # The host's control loops ran in one process: one leader, one registration of the flag's worker.
    log = gateway.log()
    assert log.count("leads the host's health checks") + log.count("leads this host's health checks") == 1, log
    assert log.count(f"worker {mock_worker_process.url} registered") == 1, log


def test_a_tenant_limit_holds_across_the_processes_without_redis(start_supervised, mock_worker_process) -> None:
    """Counted in each process, each allows its share rounded up: 4 a minute over two processes is
    2 each, 4 in all however the requests fall."""
    key = f"sk-tenant-{uuid.uuid4().hex}"
    metrics_port = free_port()
    gateway, port = start_supervised(
        "--worker-urls", mock_worker_process.url, "--tenant-api-key", f"acme:{key}", "--tenant-rate-limit", "acme=4",
        "--prometheus-port", str(metrics_port),
    )
    pinned = pin_each(gateway, port, serving_pids(gateway))
    auth = {"Authorization": f"Bearer {key}"}
    statuses = [connection.request("POST", "/v1/chat/completions", CHAT, auth)[0]
                for connection in pinned.values() for _ in range(3)]
    assert sorted(statuses) == [200, 200, 200, 200, 429, 429]

    # /metrics sums both processes (the supervisor turned multiprocess mode on).
    def responses(status: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (sample.name == "gw_http_responses_total" and sample.labels.get("path") == "/v1/chat/completions"
                        and sample.labels.get("status_code") == status):
                    return sample.value
        return 0.0

    wait_for(lambda: (responses("200"), responses("429")) == (4.0, 2.0), 10, "both processes' responses counted", gateway)


@needs_redis
def test_a_tenant_limit_is_exact_across_the_processes_with_redis(start_supervised, mock_worker_process) -> None:
    key = f"sk-tenant-{uuid.uuid4().hex}"
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    env = {"REDIS_URL": f"{REDIS}/{1 + uuid.uuid4().int % 14}"}
    gateway, port = start_supervised(
        "--worker-urls", mock_worker_process.url, "--tenant-api-key", f"{tenant}:{key}",
        "--tenant-rate-limit", f"{tenant}=4", env=env,
    )
    first, second = pin_each(gateway, port, serving_pids(gateway)).values()
    auth = {"Authorization": f"Bearer {key}"}
    assert [first.request("POST", "/v1/chat/completions", CHAT, auth)[0] for _ in range(5)] == [200] * 4 + [429]
    assert second.request("POST", "/v1/chat/completions", CHAT, auth)[0] == 429


def test_a_killed_serving_process_is_replaced_and_traffic_continues(start_supervised, mock_worker_process) -> None:
    """The leader is killed: the other process keeps serving, the supervisor starts a replacement, and
    one of the two takes the host's control loops over."""
    gateway, port = start_supervised("--worker-urls", mock_worker_process.url)
    lock = Path(gateway.env["GW_DATA_DIR"]) / "run" / f"gateway-{port}" / "leader.lock"
    victim = int(lock.read_text())
    survivor = next(pid for pid in serving_pids(gateway) if pid != victim)
    os.kill(victim, signal.SIGKILL)
    # A crash loses what the dead process had accepted; from its death on, the survivor takes all.
    wait_for(lambda: _dead(victim), 10, "the killed process gone", None)
    with httpx.Client(base_url=gateway.url, limits=httpx.Limits(max_keepalive_connections=0), timeout=30) as client:
        statuses = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(20)]
    assert statuses == [200] * 20
    wait_for(lambda: len(serving_pids(gateway)) == 2 and victim not in serving_pids(gateway), 30,
             "a replacement process", gateway)
    replacement = next(pid for pid in serving_pids(gateway) if pid != survivor)
    pinned = pin_each(gateway, port, [survivor, replacement])
    wait_for(lambda: pinned[replacement].request("POST", "/v1/chat/completions", CHAT)[0] == 200, 20,
             "the replacement serves", gateway)
    assert "exited with -9; replacing it" in gateway.log()
    # The survivor (or the replacement, if it asks first) holds the leader lock now.
    wait_for(lambda: int(lock.read_text() or 0) in (survivor, replacement), 10, "a new leader", gateway)
    assert gateway.log().count("leads th") == 2


@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_sigterm_drains_a_long_stream_and_every_process_exits(start_supervised, mock_worker_process, server: str) -> None:
    probes = free_port()
    gateway, port = start_supervised(
        "--worker-urls", mock_worker_process.url, "--health-check-port", str(probes), server=server
    )
    children = serving_pids(gateway)
    body = {**CHAT, "stream": True, "mock": {"tokens": 20, "delay_ms": 100}}
    lines: list[str] = []
    with httpx.Client(timeout=30) as client, client.stream("POST", gateway.url + "/v1/chat/completions", json=body) as stream:
        chunks = stream.iter_lines()
        lines.append(next(line for line in chunks if line))
        gateway.popen.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        def refused_or_draining() -> bool:
            try:
                main = httpx.get(gateway.url + "/readiness", timeout=1).status_code
            except httpx.ConnectError:
                main = None
            try:
                probe = httpx.get(f"http://127.0.0.1:{probes}/readiness", timeout=1).status_code
            except httpx.ConnectError:
                probe = None
            return main in (None, 503) and probe in (None, 503)

        wait_for(refused_or_draining, 5, "readiness 503 or the listener refusing", None)
        assert time.monotonic() - signalled < 2.0
        lines.extend(line for line in chunks if line)
    tokens = [line for line in lines if '"content"' in line]
    assert len(tokens) == 20 and lines[-1] == "data: [DONE]"
    assert gateway.popen.wait(timeout=30) == 0
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 10, "serving processes gone", None)
    with pytest.raises(httpx.ConnectError):
        httpx.get(gateway.url + "/liveness", timeout=1)


def test_a_rolling_restart_under_steady_load_loses_no_request(spawn, mock_worker_process) -> None:
    """Two gateway instances on one store; a client sends requests on fresh connections to both in
    turn while each is restarted in its turn. Every request either completed (200) or was never taken
    by a gateway (refused, or closed before the gateway read it): the worker saw exactly the requests
    the client got answers for."""
    ports = [free_port(), free_port()]

    def start(index: int) -> Process:
        args = ["rungateway", "--host", "127.0.0.1", "--port", str(ports[index]), "--prometheus-port", str(free_port()),
                "--worker-urls", mock_worker_process.url, "--shutdown-grace-period-secs", "20"]
        return spawn(f"gateway-{index}-{uuid.uuid4().hex[:6]}", args, ports[index], ready_path="/readiness")

    gateways = [start(0), start(1)]
    stats = mock_worker_process.url + "/_mock/stats"
    httpx.delete(stats)
    outcomes: dict[str, int] = {}
    stop = threading.Event()

    def load() -> None:
        turn = 0
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30) as client:
            while not stop.is_set():
                turn += 1
                url = f"http://127.0.0.1:{ports[turn % 2]}/v1/chat/completions"
                try:
                    kind = str(client.post(url, json=CHAT).status_code)
                except httpx.ConnectError:
                    kind = "refused"
                except (httpx.RemoteProtocolError, httpx.ReadError):
                    kind = "closed before an answer"
                outcomes[kind] = outcomes.get(kind, 0) + 1

    client = threading.Thread(target=load)
    client.start()
    try:
        time.sleep(1.0)
        for index in (0, 1):
            gateways[index].popen.send_signal(signal.SIGTERM)
            assert gateways[index].popen.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises it
            gateways[index] = start(index)
            time.sleep(1.0)
    finally:
        stop.set()
        client.join(timeout=60)
    answered = outcomes.get("200", 0)
    assert set(outcomes) <= {"200", "refused", "closed before an answer"}, outcomes
    assert answered > 50, outcomes
    assert httpx.get(stats).json()["requests_by_path"].get("/v1/chat/completions", 0) == answered, outcomes

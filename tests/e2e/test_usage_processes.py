"""Usage of several gateway processes on one store sums exactly (administration/usage_flush.py, D67):
``rungateway --workers 2`` (flushing only at its end) and a second gateway on the same store (flushing
every 0.2 s) serve one tenant; SIGTERM flushes what each process of the supervised gateway holds after
its requests finished, and the store then holds every request, its tokens and its log row."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Callable

import httpx
import orjson
import pytest

from tests.e2e.conftest import Process, free_port, wait_for
from tests.e2e.test_serving_processes import pin_each, serving_pids, start_supervised  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.embedded]

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
PER_PROCESS = 6  # requests on each serving process's connection, every other one streamed


def stored_usage(database_url: str, tenant: str) -> tuple[int, int, int, int]:
    """(requests, prompt tokens, completion tokens, request log rows) of ``tenant`` in the store."""
    minutes = ("SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(prompt_tokens), 0), "
               "COALESCE(SUM(completion_tokens), 0) FROM administration_usageminute WHERE tenant = {}")
    log = "SELECT COUNT(*) FROM administration_requestlogentry WHERE tenant = {}"
    if database_url.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            sums = conn.execute(minutes.format("?"), (tenant,)).fetchone()
            rows = conn.execute(log.format("?"), (tenant,)).fetchone()
    else:
        import psycopg

        with psycopg.connect(database_url) as conn:
            sums = conn.execute(minutes.format("%s"), (tenant,)).fetchone()  # type: ignore[arg-type]
            rows = conn.execute(log.format("%s"), (tenant,)).fetchone()  # type: ignore[arg-type]
    assert sums is not None and rows is not None
    return int(sums[0]), int(sums[1]), int(sums[2]), int(rows[0])


def usage_of(status: int, body: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens an answer reported: the body's usage, or a stream's usage chunk."""
    assert status == 200, body
    if body.startswith(b"data:"):
        chunks = [orjson.loads(line[5:]) for line in body.splitlines() if line.startswith(b"data: {")]
        usage = next(chunk["usage"] for chunk in chunks if chunk.get("usage"))
    else:
        usage = orjson.loads(body)["usage"]
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


def test_two_processes_and_a_second_gateway_sum_exactly_and_sigterm_flushes(
    start_supervised, spawn: Callable[..., Process], mock_worker_process: Process, e2e_database_url: str
) -> None:
    tenant = f"t{uuid.uuid4().hex[:10]}"
    key = f"sk-{uuid.uuid4().hex}"
    auth = {"Authorization": f"Bearer {key}"}
    flags = ("--worker-urls", mock_worker_process.url, "--tenant-api-key", f"{tenant}:{key}")
    gateway, port = start_supervised(*flags, "--usage-flush-interval-secs", "3600")
    children = serving_pids(gateway)
    pinned = pin_each(gateway, port, children)
    used = [0, 0]
    for connection in pinned.values():
        for n in range(PER_PROCESS):
            body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}} if n % 2 else CHAT
            prompt, completion = usage_of(*connection.request("POST", "/v1/chat/completions", body, auth))
            used[0] += prompt
            used[1] += completion
        connection.close()

    other_port = free_port()
    other = spawn(f"gateway-other-{other_port}", [
        "rungateway", "--host", "127.0.0.1", "--port", str(other_port), "--prometheus-port", str(free_port()),
        *flags, "--usage-flush-interval-secs", "0.2",
    ], other_port, ready_path="/readiness")
    with httpx.Client(base_url=other.url, headers=auth, timeout=30) as client:
        for _ in range(PER_PROCESS):
            answer = client.post("/v1/chat/completions", json=CHAT)
            prompt, completion = usage_of(answer.status_code, answer.content)
            used[0] += prompt
            used[1] += completion
    served = PER_PROCESS * (len(children) + 1)
    # The second gateway's loop writes within its interval; the supervised one holds its own until it stops.
    wait_for(lambda: stored_usage(e2e_database_url, tenant)[0] == PER_PROCESS, 30, "the second gateway's flush",
             other)

    gateway.popen.send_signal(signal.SIGTERM)
    assert gateway.popen.wait(timeout=60) == 0, gateway.log()
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 10, "serving processes gone", None)
    assert stored_usage(e2e_database_url, tenant) == (served, used[0], used[1], served), gateway.log()
    assert used[1] > 0


def test_sigterm_flushes_under_daphne(spawn: Callable[..., Process], mock_worker_process: Process,
                                      e2e_database_url: str) -> None:
    """daphne sends no lifespan: its shutdown trigger stops the gateway, whose last flush writes the
    requests served since start (the interval never passed)."""
    tenant = f"t{uuid.uuid4().hex[:10]}"
    key = f"sk-{uuid.uuid4().hex}"
    port = free_port()
    gateway = spawn(f"gateway-daphne-{port}", [
        "rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", "daphne", "--prometheus-port",
        str(free_port()), "--worker-urls", mock_worker_process.url, "--tenant-api-key", f"{tenant}:{key}",
        "--usage-flush-interval-secs", "3600",
    ], port, ready_path="/readiness")
    used = [0, 0]
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        for _ in range(3):
            answer = client.post("/v1/chat/completions", json=CHAT)
            prompt, completion = usage_of(answer.status_code, answer.content)
            used[0] += prompt
            used[1] += completion
    assert stored_usage(e2e_database_url, tenant) == (0, 0, 0, 0)  # held in the process until it stops
    gateway.popen.send_signal(signal.SIGTERM)
    gateway.popen.wait(timeout=60)
    assert stored_usage(e2e_database_url, tenant) == (3, used[0], used[1], 3), gateway.log()

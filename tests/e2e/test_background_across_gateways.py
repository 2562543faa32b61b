"""A background response started through one gateway process and cancelled through another sharing
its store (spec 2: "run dropped, also across gateways sharing a history backend"): the run in the
first process sees the cancel within its poll and stops: its Generate call is cancelled and the
engine gets Abort. Real processes: the
gRPC engine stand-in and two gateways on the suite's database (Postgres in CI's first pass)."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import wait_for
from standins.fixtures import FIXTURE_MODELS

pytestmark = pytest.mark.e2e

QWEN = str(FIXTURE_MODELS / "qwen3")
MODEL = "Qwen/Qwen3-8B"


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("server", ["uvicorn"], indirect=True)
def test_a_cancel_through_another_gateway_stops_the_run(spawn, start_gateway) -> None:
    port = free_port()
    engine = spawn(
        "grpc-engine",
        ["runmockworker", "--grpc", "--runtime", "sglang", "--tokenizer", QWEN, "--model", MODEL, "--host", "127.0.0.1",
         "--port", str(port), "--chunk-tokens", "1", "--delay-ms", "500"],
        None,
    )  # fmt: skip
    wait_for(lambda: _accepts(port), 30, "the engine's port", engine)
    first = start_gateway("--worker-urls", f"grpc://127.0.0.1:{port}")
    second = start_gateway("--worker-urls", f"grpc://127.0.0.1:{port}")
    for gateway in (first, second):  # each process loads the tokenizer on first use
        wait_for(
            lambda: httpx.post(gateway.url + "/v1/tokenize", json={"model": MODEL, "prompt": "hi"}, timeout=5).status_code == 200,
            60, "the tokenizer", gateway,
        )  # fmt: skip

    queued = httpx.post(first.url + "/v1/responses", json={"model": MODEL, "input": "hi", "background": True}, timeout=30).json()
    assert queued["status"] == "queued"
    wait_for(
        lambda: httpx.get(f"{second.url}/v1/responses/{queued['id']}", timeout=5).json()["status"] == "in_progress",
        20, "the run in progress, seen through the other gateway", second,
    )  # fmt: skip
    cancelled = httpx.post(f"{second.url}/v1/responses/{queued['id']}/cancel", timeout=10)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    wait_for(lambda: f"Abort of {queued['id']}" in engine.log(), 20, "the engine told to abort", first)
    assert httpx.get(f"{first.url}/v1/responses/{queued['id']}", timeout=5).json()["status"] == "cancelled"

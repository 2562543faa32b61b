"""Spec 3's runtime, allocator, in-flight age, request-body, HTTP/2 and KV-event families (D100):
through the in-process gateway and its 1 s sampler's function, scraped from the metrics listener."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from time import perf_counter

import pytest

from common import relay_metrics, runtime_metrics
from common import telemetry as metrics
from inference.gauges import sample_live_gauges
from inference.routing.registry import REGISTRY
from tests.common.metrics_fixtures import scrape  # noqa: F401 (a fixture)
from tests.conftest import record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
SLOW = {**CHAT, "mock": {"tokens": 4, "delay_ms": 400}}


def _sample(families: dict, family: str, sample: str | None = None, **labels: str) -> float | None:
    for s in families[family].samples:
        if s.name == (sample or family) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def _count(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_runtime_gauges_sampled_with_the_live_gauges(make_gateway, start_worker, scrape) -> None:
    worker = await start_worker()
    client = make_gateway([record_for(worker)])
    sample_live_gauges()  # the first sample starts the interval
    parks_before = _count("gw_runtime_worker_parks_total", worker="0")
    deadline = perf_counter() + 0.05
    while perf_counter() < deadline:  # the loop's thread busy for 50 ms
        pass
    for _ in range(3):  # and asleep in the loop's waits for I/O
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        await asyncio.sleep(0.01)
    sample_live_gauges()
    families = await scrape()
    assert _sample(families, "gw_runtime_workers") == 1
    ratio = _sample(families, "gw_runtime_worker_busy_ratio", worker="0")
    assert ratio is not None and 0 < ratio <= 1
    assert _count("gw_runtime_worker_parks_total", worker="0") - parks_before >= 3
    assert _sample(families, "gw_runtime_global_queue_depth") is not None


async def test_the_queue_depth_is_the_work_ready_to_run() -> None:
    loop = asyncio.get_running_loop()

    async def nothing() -> None:
        await asyncio.sleep(0)

    waiting = asyncio.ensure_future(asyncio.sleep(30))
    await asyncio.sleep(0)  # the sleeper waits on its timer's future
    base = runtime_metrics.ready_depth(loop)
    tasks = [asyncio.ensure_future(nothing()) for _ in range(4)]  # created: ready to take a step
    assert runtime_metrics.ready_depth(loop) == base + 4
    await asyncio.gather(*tasks)
    assert runtime_metrics.ready_depth(loop) == base
    waiting.cancel()


def test_the_stdlib_loops_ready_queue_is_read_as_it_is() -> None:
    loop = asyncio.SelectorEventLoop()
    try:
        for _ in range(3):
            loop.call_soon(lambda: None)
        assert runtime_metrics.ready_depth(loop) == 3
    finally:
        loop.close()


_ALLOCATION = """
import math
from common import runtime_metrics
allocated, active, resident, metadata = runtime_metrics.allocator_figures()
assert 0 < allocated <= active and resident > 0 and math.isnan(metadata)
block = bytearray(64 * 2**20)  # past glibc's mmap threshold: an mmapped chunk, counted in hblkhd
grown, grown_active, grown_resident, _ = runtime_metrics.allocator_figures()
assert grown - allocated >= 64 * 2**20 and grown_active - active >= 64 * 2**20, (allocated, active, grown, grown_active)
block[:: 4096] = b"x" * len(block[:: 4096])  # touched: resident
assert runtime_metrics.allocator_figures()[2] - resident >= 60 * 2**20
print("ok")
"""


def test_allocator_figures_follow_an_allocation() -> None:
    # In a fresh interpreter: in this one, thousands of tests may have left a free region of the heap
    # large enough for the block, which malloc then takes from its bins (no new mapping: active and
    # resident do not move), whatever the mmap threshold.
    probe = subprocess.run(
        [sys.executable, "-c", _ALLOCATION], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert probe.stdout.strip() == "ok", probe.stderr
    runtime_metrics.sample_allocator()
    assert metrics.REGISTRY.get_sample_value("gw_allocator_allocated_bytes") == pytest.approx(
        runtime_metrics.allocator_figures()[0], rel=0.05
    )
    assert math.isnan(metrics.REGISTRY.get_sample_value("gw_allocator_metadata_bytes") or 0.0)


def test_allocator_refreshed_every_60_seconds() -> None:
    runtime_metrics.sample_runtime()
    due = runtime_metrics._SAMPLES.allocator_due
    assert due - time.monotonic() > 55
    runtime_metrics.sample_runtime()
    assert runtime_metrics._SAMPLES.allocator_due == due  # not re-read within the 60 s


def test_age_buckets_are_non_cumulative() -> None:
    assert runtime_metrics.age_buckets([0.5, 30.0, 30.1, 61, 90000, 86400]) == [2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]


async def test_inflight_request_ages_from_the_requests_in_flight(make_gateway, start_worker, scrape) -> None:
    worker = await start_worker()
    client = make_gateway([record_for(worker)])
    slow = asyncio.create_task(client.post("/v1/chat/completions", json=SLOW))
    await asyncio.sleep(0.15)
    now = perf_counter()
    counts = runtime_metrics.sample_inflight_ages(now + 45)  # as if sampled 45 s later
    assert counts[1] == 1 and sum(counts) == 1  # 30 < age <= 60
    families = await scrape()
    assert _sample(families, "gw_http_inflight_request_age_count", gt="30", le="60") == 1
    assert _sample(families, "gw_http_inflight_request_age_count", gt="0", le="30") == 0
    assert _sample(families, "gw_http_inflight_request_age_count", gt="86400", le="+Inf") == 0
    assert (await slow).status_code == 200
    assert not metrics.INFLIGHT  # the finished request left the set
    assert runtime_metrics.sample_inflight_ages() == [0] * 12


async def test_each_routed_body_is_counted_buffered(make_gateway, start_worker, scrape) -> None:
    worker = await start_worker()
    client = make_gateway([record_for(worker)])
    before = _count("gw_router_request_body_path_total", path="buffered", reason="parsed")
    for body in (CHAT, {**CHAT, "stream": True}):
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert (await client.post("/v1/chat/completions", content=b"{nope")).status_code == 400  # not routed
    assert _count("gw_router_request_body_path_total", path="buffered", reason="parsed") - before == 2
    families = await scrape()
    assert _sample(families, "gw_router_request_body_path", "gw_router_request_body_path_total", path="streamed") is None
    assert _sample(families, "gw_router_request_buffers_released_early_bytes",
                   "gw_router_request_buffers_released_early_bytes_total") == 0  # fmt: skip
    assert "gw_router_upstream_send_retries" in families  # declared before any resend (D113)
    assert "gw_kv_event_subscription_failures" in families  # declared: no KV event subscription


def test_routed_bodies_are_folded_in_exactly_once() -> None:
    """The request path's C counter is folded into the body-path counter by the sampler and on
    collection, each request once, however the folds fall."""
    before = _count("gw_router_request_body_path_total", path="buffered", reason="parsed")
    for _ in range(5):
        relay_metrics.count_buffered_body()
    relay_metrics.fold_bodies()
    relay_metrics.fold_bodies()
    for _ in range(3):
        relay_metrics.count_buffered_body()
    assert _count("gw_router_request_body_path_total", path="buffered", reason="parsed") - before == 8
    sample_live_gauges()
    assert _count("gw_router_request_body_path_total", path="buffered", reason="parsed") - before == 8


async def test_worker_http2_gauge(make_gateway, start_worker, scrape) -> None:
    worker = await start_worker()
    make_gateway([record_for(worker), record_for("grpc://127.0.0.1:1", model="g")])
    sample_live_gauges()
    families = await scrape()
    assert _sample(families, "gw_worker_http2", worker=worker.url) == 0
    assert _sample(families, "gw_worker_http2", worker="grpc://127.0.0.1:1") == 1
    REGISTRY.publish([h.record for h in REGISTRY.snapshot.workers if h.record.url == worker.url], {})
    sample_live_gauges()
    families = await scrape()
    assert _sample(families, "gw_worker_http2", worker="grpc://127.0.0.1:1") == 0  # removed


_MULTIPROCESS = """
import asyncio, sys
from common import runtime_metrics
from common import telemetry
async def main():
    runtime_metrics.sample_runtime()
    await asyncio.sleep(0.05)
    runtime_metrics.sample_runtime()
    telemetry.flush_buffered_metrics()
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
asyncio.run(main())
"""


def test_multiprocess_sums_the_loops_and_keeps_one_series_per_process(tmp_path: Path) -> None:
    """--workers N: each serving process's loop is one worker (GW_SERVING_INDEX), the export sums
    gw_runtime_workers over the live processes and keeps each one's busy ratio and parks."""
    from prometheus_client import CollectorRegistry, multiprocess

    root = Path(__file__).resolve().parents[2]
    procs = []
    for index in range(2):
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "GW_RUN_DIR": str(tmp_path / "run"),
               "GW_SERVING_INDEX": str(index), "GW_SERVING_PROCESSES": "2"}  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-c", _MULTIPROCESS], cwd=root, env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        procs.append(proc)
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
        assert registry.get_sample_value("gw_runtime_workers") == 2
        for worker in ("0", "1"):
            ratio = registry.get_sample_value("gw_runtime_worker_busy_ratio", {"worker": worker})
            assert ratio is not None and 0 <= ratio <= 1
            assert (registry.get_sample_value("gw_runtime_worker_parks_total", {"worker": worker}) or 0) >= 1
    finally:
        for proc in procs:
            proc.communicate("\n", timeout=30)

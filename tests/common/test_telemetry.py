"""The gw_* metrics: real traffic through the in-process gateway, then /metrics scraped over HTTP from
the separate metrics listener."""

from __future__ import annotations

import asyncio
import threading

import pytest

from common import telemetry as metrics
from inference.accounting import TokenUsage
from inference.gauges import sample_live_gauges
from inference.routing.registry import REGISTRY
from tests.common.metrics_fixtures import scrape  # noqa: F401 (a fixture)
from tests.conftest import record_for

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
SLOW = {**CHAT, "mock": {"tokens": 4, "delay_ms": 300}}
FAST_RETRY = {"retry_initial_backoff_ms": 1, "retry_max_backoff_ms": 5}


def _value(families: dict, family: str, sample: str, **labels: str) -> float:
    total = 0.0
    found = False
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
            found = True
    assert found, f"no {sample} {labels}"
    return total


def _labels(families: dict, family: str) -> set[str]:
    return {key for sample in families[family].samples for key in sample.labels}


async def test_traffic_shows_up_in_every_family(make_gateway, start_worker, scrape) -> None:
    failing, healthy = await start_worker(), await start_worker()
    failing.state.fault_status = 500
    client = make_gateway(
        [record_for(failing), record_for(healthy)], policy="round_robin", max_concurrent_requests=1, queue_size=0,
        **FAST_RETRY,
    )
    before = await scrape()
    for _ in range(2):  # one of them starts on the failing worker and is retried
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert streamed.status_code == 200
    assert (await client.post("/v1/chat/completions", content=b"{nope")).status_code == 400
    slow = asyncio.create_task(client.post("/v1/chat/completions", json=SLOW))
    await asyncio.sleep(0.1)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 429
    assert (await slow).status_code == 200
    sample_live_gauges()
    after = await scrape()

    def delta(family: str, sample: str, **labels: str) -> float:
        old = _value(before, family, sample, **labels) if family in before and any(
            s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()) for s in before[family].samples
        ) else 0.0
        return _value(after, family, sample, **labels) - old

    path = "/v1/chat/completions"
    assert after["gw_http_requests"].type == "counter"
    assert delta("gw_http_requests", "gw_http_requests_total", method="POST", path=path) == 6
    assert delta("gw_http_responses", "gw_http_responses_total", path=path, status_code="200", error_code="") == 4
    assert delta("gw_http_responses", "gw_http_responses_total", path=path, status_code="400",
                 error_code="json_parse_error") == 1
    assert delta("gw_http_responses", "gw_http_responses_total", path=path, status_code="429",
                 error_code="admission_queue_full") == 1
    assert after["gw_http_request_duration_seconds"].type == "histogram"
    assert delta("gw_http_request_duration_seconds", "gw_http_request_duration_seconds_count", path=path) == 6
    assert after["gw_http_connections_active"].type == "gauge"

    assert delta("gw_admission_queue_rejected", "gw_admission_queue_rejected_total", reason="full") == 1
    assert after["gw_admission_inflight"].type == "gauge"
    assert _value(after, "gw_admission_inflight", "gw_admission_inflight") == 0
    assert _value(after, "gw_admission_queue_depth", "gw_admission_queue_depth") == 0

    router = {"router_type": "http", "backend_type": "regular", "connection_mode": "http", "model": "mock-model",
              "endpoint": path}
    assert delta("gw_router_requests", "gw_router_requests_total", **router, streaming="false") == 3
    assert delta("gw_router_requests", "gw_router_requests_total", **router, streaming="true") == 1
    assert after["gw_router_request_duration_seconds"].type == "histogram"
    assert delta("gw_router_request_duration_seconds", "gw_router_request_duration_seconds_count", **router) == 4
    stream_labels = {"router_type": "http", "backend_type": "regular", "model": "mock-model", "endpoint": path}
    assert delta("gw_router_ttft_seconds", "gw_router_ttft_seconds_count", **stream_labels) == 1
    assert delta("gw_router_generation_duration_seconds", "gw_router_generation_duration_seconds_count",
                 **stream_labels) == 1
    assert _labels(after, "gw_router_request_errors") >= {*router, "error_type"}
    assert delta("gw_router_upstream_responses", "gw_router_upstream_responses_total", router_type="http",
                 status_code="500") >= 1

    assert delta("gw_worker_retries", "gw_worker_retries_total", worker_type="regular", endpoint=path) >= 1
    assert after["gw_worker_retry_backoff_seconds"].type == "summary"
    assert delta("gw_worker_retry_backoff_seconds", "gw_worker_retry_backoff_seconds_count", attempt="1") >= 1
    assert delta("gw_worker_selection", "gw_worker_selection_total", worker_type="regular", connection_mode="http",
                 model="mock-model", policy="round_robin") == 4
    assert delta("gw_worker_cb_outcomes", "gw_worker_cb_outcomes_total", worker=failing.url, outcome="failure") >= 1
    assert delta("gw_worker_cb_outcomes", "gw_worker_cb_outcomes_total", worker=healthy.url, outcome="success") >= 3
    for url in (failing.url, healthy.url):
        assert _value(after, "gw_worker_health", "gw_worker_health", worker=url) == 1
        assert _value(after, "gw_worker_cb_state", "gw_worker_cb_state", worker=url) == 0
        assert _value(after, "gw_worker_requests_active", "gw_worker_requests_active", worker=url) == 0
    assert _value(after, "gw_worker_cb_consecutive_failures", "gw_worker_cb_consecutive_failures",
                  worker=failing.url) >= 1
    assert _value(after, "gw_worker_pool_size", "gw_worker_pool_size", worker_type="regular",
                  connection_mode="http", model="mock-model") == 2
    assert _value(after, "gw_worker_overload_shed", "gw_worker_overload_shed_total", stage="dispatch") == 0
    assert after["gw_runtime_event_loop_delay_seconds"].type == "histogram"
    assert after["gw_runtime_event_loop_stalls"].type == "counter"


async def test_streams_record_ttft_tpot_and_generation(make_gateway, worker, scrape) -> None:
    client = make_gateway([record_for(worker)])
    labels = {"router_type": "http", "backend_type": "regular", "model": "mock-model", "endpoint": "/v1/chat/completions"}

    def counts(families: dict) -> dict[str, float]:
        found = {}
        for family in ("gw_router_ttft_seconds", "gw_router_tpot_seconds", "gw_router_generation_duration_seconds"):
            for suffix in ("_count", "_sum"):
                try:
                    found[family + suffix] = _value(families, family, family + suffix, **labels)
                except (KeyError, StopIteration, AssertionError):
                    found[family + suffix] = 0.0
        return found

    before = counts(await scrape())
    body = {**CHAT, "stream": True, "mock": {"tokens": 6, "delay_ms": 20}}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert [line async for line in response.aiter_lines() if line][-1] == "data: [DONE]"
    after = counts(await scrape())
    for family in ("gw_router_ttft_seconds", "gw_router_tpot_seconds", "gw_router_generation_duration_seconds"):
        assert after[family + "_count"] - before[family + "_count"] == 1
    # The mock sleeps 20 ms before each of its 6 tokens; its closing chunk follows the last token at
    # once, so the 7 events after the first span at least 5 sleeps: 100 ms / 6 intervals.
    assert after["gw_router_tpot_seconds_sum"] - before["gw_router_tpot_seconds_sum"] >= 0.1 / 6 - 0.001
    generation = after["gw_router_generation_duration_seconds_sum"] - before["gw_router_generation_duration_seconds_sum"]
    assert generation >= after["gw_router_ttft_seconds_sum"] - before["gw_router_ttft_seconds_sum"]


async def test_breaker_transitions_and_removed_workers(make_gateway, start_worker, scrape) -> None:
    failing, healthy = await start_worker(), await start_worker()
    failing.state.fault_status = 500
    client = make_gateway(
        [record_for(failing), record_for(healthy)], policy="round_robin", cb_failure_threshold=1, **FAST_RETRY
    )
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    sample_live_gauges()
    families = await scrape()
    assert _value(families, "gw_worker_cb_transitions", "gw_worker_cb_transitions_total",
                  worker=failing.url, **{"from": "closed", "to": "open"}) >= 1
    assert _value(families, "gw_worker_cb_state", "gw_worker_cb_state", worker=failing.url) == 1

    REGISTRY.publish([record for record in (h.record for h in REGISTRY.snapshot.workers) if record.url == healthy.url], {})
    sample_live_gauges()
    families = await scrape()
    assert _value(families, "gw_worker_health", "gw_worker_health", worker=failing.url) == -1
    assert _value(families, "gw_worker_cb_state", "gw_worker_cb_state", worker=failing.url) == -1
    assert _value(families, "gw_worker_requests_active", "gw_worker_requests_active", worker=failing.url) == 0


async def test_engine_gauges_follow_load_reports(scrape) -> None:
    entry = {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 2, "token_usage": 0.5,
             "gen_throughput": 12.0, "cache_hit_rate": 0.25}
    metrics.record_engine_load("http://engine-a:1", "engine-model", [entry])
    families = await scrape()
    labels = {"worker": "http://engine-a:1", "model": "engine-model", "dp_rank": "0"}
    assert _value(families, "gw_engine_running_requests", "gw_engine_running_requests", **labels) == 3
    assert _value(families, "gw_engine_waiting_requests", "gw_engine_waiting_requests", **labels) == 2
    assert _value(families, "gw_engine_token_usage", "gw_engine_token_usage", **labels) == 0.5
    metrics.record_engine_load("http://engine-a:1", "engine-model", None)
    families = await scrape()
    assert _value(families, "gw_engine_cache_hit_rate", "gw_engine_cache_hit_rate", **labels) == -1


def test_model_label_keeps_the_first_1024_values(monkeypatch) -> None:
    monkeypatch.setattr(metrics, "_models", {f"m{i}" for i in range(1024)})
    assert metrics.bounded_model("m5") == "m5"
    assert metrics.bounded_model("brand-new") == "other"


def test_duration_buckets_come_from_the_flag() -> None:
    metrics.configure((0.5, 0.1))
    try:
        assert metrics.HTTP_DURATION._upper_bounds[:2] == [0.1, 0.5]
    finally:
        metrics.configure(())
    assert metrics.HTTP_DURATION._upper_bounds[0] == metrics.DEFAULT_DURATION_BUCKETS[0]


def test_multiprocess_increments_reach_the_files_when_flushed(tmp_path) -> None:
    """In multiprocess mode counter and histogram increments stay in memory until the sampler's
    flush (or the process's exit), and then every one of them is in the files."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "from prometheus_client import CollectorRegistry, multiprocess\n"
        "from common import telemetry as metrics\n"
        "def total():\n"
        "    registry = CollectorRegistry()\n"
        "    multiprocess.MultiProcessCollector(registry)\n"
        "    return registry.get_sample_value('gw_worker_cb_outcomes_total', {'worker': 'http://f:1', 'outcome': 'success'}) or 0\n"
        "for _ in range(5):\n"
        "    metrics.record_breaker_outcome('http://f:1', False)\n"
        "assert total() == 0, total()\n"
        "metrics.flush_buffered_metrics()\n"
        "assert total() == 5, total()\n"
        "metrics.record_breaker_outcome('http://f:1', False)\n"
        "metrics.flush_buffered_metrics()\n"
        "metrics.flush_buffered_metrics()\n"
        "assert total() == 6, total()\n"
        "metrics.record_breaker_outcome('http://f:1', False)\n"  # left for the exit flush
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    assert registry.get_sample_value("gw_worker_cb_outcomes_total", {"worker": "http://f:1", "outcome": "success"}) == 7


def test_a_memoized_observation_counts_as_histogram_observe() -> None:
    """telemetry._observe (bisection over the bounds, the child's values incremented directly) leaves
    the same buckets, count and sum as prometheus_client's own observe, bounds themselves included."""
    from prometheus_client import CollectorRegistry, Histogram

    bounds = (0.005, 0.01, 0.1, 1.0, 10.0)
    amounts = [0.0, -1.0, 0.005, 0.0051, 0.01, 0.05, 0.1, 1.0, 9.99, 10.0, 10.01, 1e9, float("inf")]
    theirs = Histogram("h_theirs", "h", ("path",), buckets=bounds, registry=CollectorRegistry())
    ours = Histogram("h_ours", "h", ("path",), buckets=bounds, registry=CollectorRegistry())
    for amount in amounts:
        theirs.labels("/p").observe(amount)
        metrics._observe(ours, "/p")(amount)

    def samples(histogram: Histogram) -> list[tuple[str, dict, float]]:
        [family] = histogram.collect()
        return [(s.name.split("_", 2)[-1], s.labels, s.value) for s in family.samples if "created" not in s.name]

    assert samples(ours) == samples(theirs)


def test_an_unlabelled_histogram_observes_as_histogram_observe() -> None:
    """The canary's observation (telemetry._histogram_observe of the unlabelled histogram) leaves the
    same buckets, count and sum as prometheus_client's observe."""
    from prometheus_client import CollectorRegistry, Histogram

    bounds = (0.0, 0.001, 0.005, 0.01, 1.0)
    amounts = [0.0, 0.0005, 0.001, 0.004, 0.02, 3.0]
    theirs = Histogram("u_theirs", "h", buckets=bounds, registry=CollectorRegistry())
    ours = Histogram("u_ours", "h", buckets=bounds, registry=CollectorRegistry())
    observe = metrics._histogram_observe(ours)
    for amount in amounts:
        theirs.observe(amount)
        observe(amount)
    [mine], [reference] = ours.collect(), theirs.collect()
    strip = lambda family: [(s.name.split("_", 2)[-1], s.labels, s.value) for s in family.samples if "created" not in s.name]  # noqa: E731
    assert strip(mine) == strip(reference)


async def test_the_canary_observes_its_ticks_samples_and_stops_when_cancelled() -> None:
    """run_sampler: the canary's ticks reach the loop-delay histogram, ``sample`` runs, and
    cancelling the sampler stops its timer (no tick after it)."""
    sampled = asyncio.Event()
    calls: list[int] = []

    def sample() -> None:
        calls.append(1)
        sampled.set()

    def ticks() -> float:
        return sum(s.value for s in metrics.LOOP_DELAY.collect()[0].samples if s.name.endswith("_count"))

    before = ticks()
    sampler = asyncio.ensure_future(metrics.run_sampler(sample, interval=3600.0))
    await asyncio.wait_for(sampled.wait(), 10.0)
    while ticks() < before + 2:
        await asyncio.sleep(0.01)
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)
    assert sampler.cancelled()
    stopped = ticks()
    await asyncio.sleep(0.05)
    assert ticks() == stopped
    assert calls == [1]


def test_noted_tokens_are_folded_exactly_while_requests_note_more() -> None:
    """The request path notes tokens without a lock (D96): notes made on several threads while folds
    run on others are each counted once, and a read of the registry folds what is left first."""
    labels = {"model": "fold-model", "tenant": "", "token_type": "prompt"}
    before = metrics.REGISTRY.get_sample_value("gw_usage_tokens_total", labels) or 0.0
    usage = TokenUsage(3, 0)

    def note() -> None:
        for _ in range(2_000):
            metrics.note_tokens((None, "fold-model", "", usage))

    def fold() -> None:
        for _ in range(200):
            metrics.fold_tokens()

    threads = [threading.Thread(target=work) for work in (note, note, note, fold, fold)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert metrics.REGISTRY.get_sample_value("gw_usage_tokens_total", labels) - before == 3 * 2_000 * 3


def test_multiprocess_noted_tokens_reach_the_files_when_flushed(tmp_path) -> None:
    """In multiprocess mode the tokens noted by accounted requests are folded into their counters by
    the sampler's flush (D96), so the process that exports the files sees them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "from prometheus_client import CollectorRegistry, multiprocess\n"
        "from common import telemetry as metrics\n"
        "from inference.accounting import TokenUsage\n"
        "def total(kind):\n"
        "    registry = CollectorRegistry()\n"
        "    multiprocess.MultiProcessCollector(registry)\n"
        "    return registry.get_sample_value('gw_usage_tokens_total', {'model': 'm', 'tenant': '', 'token_type': kind}) or 0\n"
        "for _ in range(4):\n"
        "    metrics.note_tokens((None, 'm', '', TokenUsage(10, 2, 1, 0)))\n"
        "assert total('prompt') == 0, total('prompt')\n"
        "metrics.flush_buffered_metrics()\n"
        "assert (total('prompt'), total('completion'), total('cached')) == (40, 8, 4)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

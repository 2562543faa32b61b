"""Circuit breaker transitions and the retry policy's arithmetic."""

from __future__ import annotations

import pytest

from inference.routing.breaker import BreakerState, CircuitBreaker, Resilience
from inference.routing.retry import RetryPolicy


def test_opens_after_consecutive_failures_only() -> None:
    breaker = CircuitBreaker(Resilience(failure_threshold=3))
    breaker.record(True, now=0)
    breaker.record(True, now=0)
    breaker.record(False, now=0)  # a success resets the count
    breaker.record(True, now=0)
    breaker.record(True, now=0)
    assert breaker.state is BreakerState.CLOSED
    breaker.record(True, now=0)
    assert breaker.state is BreakerState.OPEN and not breaker.allows(now=1)


def test_half_open_after_timeout_then_closes_after_successes() -> None:
    breaker = CircuitBreaker(Resilience(failure_threshold=1, success_threshold=2, timeout_secs=10))
    breaker.record(True, now=100)
    assert not breaker.allows(now=109.9)
    assert breaker.allows(now=110) and breaker.state is BreakerState.HALF_OPEN
    breaker.record(False, now=111)
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.record(False, now=112)
    assert breaker.state is BreakerState.CLOSED


def test_half_open_failure_reopens() -> None:
    breaker = CircuitBreaker(Resilience(failure_threshold=5, timeout_secs=1))
    for _ in range(5):
        breaker.record(True, now=0)
    assert breaker.allows(now=2) and breaker.state is BreakerState.HALF_OPEN
    breaker.record(True, now=2)
    assert breaker.state is BreakerState.OPEN and not breaker.allows(now=2.5)


@pytest.mark.parametrize(("status", "counted"), [(500, True), (503, True), (408, True), (429, False), (400, False), (404, False), (200, False)])
def test_which_statuses_count(status: int, counted: bool) -> None:
    assert Resilience().counts_as_failure(status) is counted


def test_worker_block_replaces_the_status_sets() -> None:
    config = Resilience(retryable_statuses=frozenset({500, 429}), capacity_statuses=frozenset())
    assert config.counts_as_failure(429) and not config.counts_as_failure(503)


def test_disabled_breaker_never_opens() -> None:
    breaker = CircuitBreaker(Resilience(failure_threshold=1, enabled=False))
    breaker.record(True, now=0)
    assert breaker.state is BreakerState.CLOSED and breaker.allows(now=0)


def test_backoff_grows_caps_and_jitters() -> None:
    policy = RetryPolicy(initial_backoff_ms=100, multiplier=2, max_backoff_ms=500, jitter=0.2)
    for _ in range(50):
        assert 0.08 <= policy.backoff_secs(1) <= 0.12
        assert 0.16 <= policy.backoff_secs(2) <= 0.24
        assert 0.40 <= policy.backoff_secs(5) <= 0.60


def test_retries_need_budget_and_a_replayable_body() -> None:
    policy = RetryPolicy(max_retries=2, max_replayable_bytes=100)
    assert policy.allows(0, 100) and policy.allows(1, 10)
    assert not policy.allows(2, 10) and not policy.allows(0, 101)


def _cb_sample(name: str, **labels: str) -> float:
    from common import telemetry

    return telemetry.REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_labelled_breaker_records_its_own_outcomes_and_transitions() -> None:
    url = "http://breaker-label-test:1"
    breaker = CircuitBreaker(Resilience(failure_threshold=1, success_threshold=1, timeout_secs=0), label=url)
    breaker.record(True, now=0)
    assert breaker.allows(now=1) and breaker.state is BreakerState.HALF_OPEN
    breaker.record(False, now=1)
    assert _cb_sample("gw_worker_cb_outcomes_total", worker=url, outcome="failure") == 1
    assert _cb_sample("gw_worker_cb_outcomes_total", worker=url, outcome="success") == 1
    for old, new in (("closed", "open"), ("open", "half_open"), ("half_open", "closed")):
        assert _cb_sample("gw_worker_cb_transitions_total", worker=url, **{"from": old, "to": new}) == 1
    assert _cb_sample("gw_worker_cb_state", worker=url) == 0


def test_the_registry_labels_each_breaker_with_its_worker() -> None:
    from inference.routing.registry import WorkerRegistry
    from inference.routing.workers import WorkerRecord, WorkerStatus

    registry = WorkerRegistry()
    record = WorkerRecord(id="w", url="http://old:1", model_id="m", runtime_type="sglang", status=WorkerStatus.READY)
    registry.publish([record], {})
    load = registry.load_of("w")
    assert load is not None and load.breaker.label == "http://old:1"
    registry.publish([WorkerRecord(id="w", url="http://new:1", model_id="m", runtime_type="sglang",
                                   status=WorkerStatus.READY)], {})
    assert registry.load_of("w") is load and load.breaker.label == "http://new:1"


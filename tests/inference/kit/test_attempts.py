"""The attempts loop on its own, with a transport it has never heard of: a retryable status moves to
another worker (the answer dropped, never delivered), a failure before the answer moves on too, and
the last worker's retryable answer is delivered as it is. Every attempt's outcome is recorded once on
its worker's breaker, and every in-flight slot is given back."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from common import telemetry
from common.config import GatewayConfig
from inference.accounting import Delivered
from inference.dataplane import DataPlane
from inference.errors import GatewayError
from inference.kit import RoutePlan, run_attempts, run_turn
from inference.routing.registry import WorkerRegistry
from inference.routing.workers import WorkerHandle, WorkerRecord, WorkerStatus
from inference.upstreams import FailureKind, UpstreamFailure
from inference.writers import ResponseClock


@dataclass
class FakeAnswer:
    status: int
    worker: str
    discarded: bool = False

    async def discard(self) -> None:
        self.discarded = True


@dataclass
class FakeUpstream:
    """Answers per worker URL: a status, or a failure kind raised before any answer."""

    script: dict[str, int | FailureKind]
    opened: list[FakeAnswer] = field(default_factory=list)
    delivered: list[FakeAnswer] = field(default_factory=list)
    clean: bool = True

    async def open_on(self, worker: WorkerHandle) -> FakeAnswer:
        assert worker.load.in_flight == 1  # the attempt holds its worker's slot
        outcome = self.script[worker.url]
        if isinstance(outcome, FailureKind):
            raise UpstreamFailure(outcome, "scripted", 1.0)
        answer = FakeAnswer(outcome, worker.url)
        self.opened.append(answer)
        return answer

    async def deliver(self, answer: FakeAnswer) -> Delivered:
        self.delivered.append(answer)
        return Delivered(self.clean)


def data_plane_with(*urls: str, max_retries: int = 5) -> tuple[DataPlane, WorkerRegistry]:
    config = GatewayConfig(retry_max_retries=max_retries, retry_initial_backoff_ms=1, retry_max_backoff_ms=1,
                           policy="round_robin")
    dp = DataPlane.build(config)
    registry = WorkerRegistry()
    registry.publish(
        [WorkerRecord(id=url, url=url, model_id="m", runtime_type="sglang", status=WorkerStatus.READY) for url in urls],
        {},
    )
    dp.registry = registry
    return dp, registry


def outcomes(url: str, outcome: str) -> float:
    return telemetry.REGISTRY.get_sample_value(
        "gw_worker_cb_outcomes_total", {"worker": url, "outcome": outcome}
    ) or 0.0


async def run(dp: DataPlane, registry: WorkerRegistry, upstream: FakeUpstream, first: str) -> None:
    plan = RoutePlan("/v1/chat/completions", "m", None, {}, 10)
    route = telemetry.RouteTimer("/v1/chat/completions", "m", False, 0.0)
    handle = next(h for h in registry.snapshot.workers if h.url == first)
    await run_attempts(dp, plan, route, ResponseClock(0.0), handle, upstream.open_on, upstream.deliver)


async def test_a_retryable_status_moves_to_the_next_worker() -> None:
    a, b = "fake://attempts-a1", "fake://attempts-b1"
    dp, registry = data_plane_with(a, b)
    upstream = FakeUpstream({a: 503, b: 200})
    await run(dp, registry, upstream, a)
    first, second = upstream.opened
    assert first.discarded and not second.discarded
    assert upstream.delivered == [second]
    assert (outcomes(a, "failure"), outcomes(b, "success")) == (1, 1)
    assert all(h.load.in_flight == 0 for h in registry.snapshot.workers)


async def test_a_failure_before_the_answer_moves_on_and_the_last_one_is_the_error() -> None:
    a, b = "fake://attempts-a2", "fake://attempts-b2"
    dp, registry = data_plane_with(a, b)
    upstream = FakeUpstream({a: FailureKind.CONNECT, b: FailureKind.TIMEOUT})
    with pytest.raises(GatewayError) as raised:
        await run(dp, registry, upstream, a)
    assert raised.value.status == 504 and raised.value.code == "upstream_timeout"
    assert (outcomes(a, "failure"), outcomes(b, "failure")) == (1, 1)
    assert not upstream.delivered
    assert all(h.load.in_flight == 0 for h in registry.snapshot.workers)


async def test_the_last_workers_retryable_answer_is_delivered_as_it_is() -> None:
    a = "fake://attempts-a3"
    dp, registry = data_plane_with(a)
    upstream = FakeUpstream({a: 503})
    await run(dp, registry, upstream, a)
    [answer] = upstream.delivered
    assert answer.status == 503 and not answer.discarded
    assert outcomes(a, "failure") == 1  # 503 counts against the breaker, once


async def test_a_stream_broken_after_it_started_counts_as_a_failure() -> None:
    a = "fake://attempts-a4"
    dp, registry = data_plane_with(a)
    upstream = FakeUpstream({a: 200}, clean=False)
    await run(dp, registry, upstream, a)
    assert outcomes(a, "failure") == 1 and outcomes(a, "success") == 0


async def test_no_retry_when_retries_are_off() -> None:
    a, b = "fake://attempts-a5", "fake://attempts-b5"
    dp, registry = data_plane_with(a, b, max_retries=0)
    upstream = FakeUpstream({a: FailureKind.BROKEN, b: 200})
    with pytest.raises(GatewayError) as raised:
        await run(dp, registry, upstream, a)
    assert raised.value.status == 502 and not upstream.opened


async def test_a_request_the_worker_refuses_as_invalid_is_the_clients_400_on_the_first_worker() -> None:
    """An engine's INVALID_ARGUMENT (``UpstreamFailure.rejected``): answered 400 at once, never tried
    on the next worker, counted as the answer it is (never a failure), the slot given back."""
    a, b = "fake://attempts-a6", "fake://attempts-b6"
    dp, registry = data_plane_with(a, b)

    class Refusing(FakeUpstream):
        async def open_on(self, worker: WorkerHandle) -> FakeAnswer:
            if worker.url == a:
                raise UpstreamFailure.refused("sglang Generate: INVALID_ARGUMENT: input_ids must not be empty")
            return await super().open_on(worker)

    upstream = Refusing({b: 200})
    with pytest.raises(GatewayError) as raised:
        await run(dp, registry, upstream, a)
    assert (raised.value.status, raised.value.code, raised.value.error_type) == (400, 400, "invalid_request_error")
    assert "input_ids must not be empty" in raised.value.message
    assert not upstream.opened and not upstream.delivered  # b never tried
    assert (outcomes(a, "failure"), outcomes(a, "success"), outcomes(b, "success")) == (0, 1, 0)
    assert all(h.load.breaker.failures == 0 and h.load.in_flight == 0 for h in registry.snapshot.workers)


# Later turns of one request (a Responses tool round, a background run): run_turn.


async def test_a_later_turn_runs_on_its_worker_and_records_its_outcome_once() -> None:
    dp, registry = data_plane_with("http://w1", "http://w2")
    upstream = FakeUpstream({"http://w1": 200, "http://w2": 200})
    handle = next(h for h in registry.snapshot.workers if h.url == "http://w2")
    before = outcomes("http://w2", "success")
    await run_turn(dp, handle, "/v1/responses", ResponseClock(0.0), upstream.open_on, upstream.deliver)
    assert [a.worker for a in upstream.delivered] == ["http://w2"]
    assert outcomes("http://w2", "success") == before + 1
    assert handle.load.in_flight == 0


async def test_a_later_turn_that_fails_is_not_retried_elsewhere_and_counts_once_on_its_worker() -> None:
    dp, registry = data_plane_with("http://w1", "http://w2")
    upstream = FakeUpstream({"http://w1": 200, "http://w2": FailureKind.BROKEN})
    handle = next(h for h in registry.snapshot.workers if h.url == "http://w2")
    failures = outcomes("http://w2", "failure")
    with pytest.raises(GatewayError) as raised:
        await run_turn(dp, handle, "/v1/responses", ResponseClock(0.0), upstream.open_on, upstream.deliver)
    assert raised.value.status == 502
    assert upstream.opened == [] and upstream.delivered == []  # w1 was never tried
    assert outcomes("http://w2", "failure") == failures + 1
    assert handle.load.in_flight == 0


async def test_a_later_turn_answered_with_a_retryable_status_is_delivered_not_retried() -> None:
    dp, registry = data_plane_with("http://w1", "http://w2")
    upstream = FakeUpstream({"http://w1": 200, "http://w2": 503})
    handle = next(h for h in registry.snapshot.workers if h.url == "http://w2")
    failures = outcomes("http://w2", "failure")
    await run_turn(dp, handle, "/v1/responses", ResponseClock(0.0), upstream.open_on, upstream.deliver)
    assert [(a.worker, a.status) for a in upstream.delivered] == [("http://w2", 503)]
    assert outcomes("http://w2", "failure") == failures + 1  # a 503 is the worker's failure

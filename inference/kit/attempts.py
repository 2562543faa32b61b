"""The attempts loop: try the chosen worker; on a retryable outcome, while nothing reached the client,
try the next worker the policy picks (never one already tried) after a backoff.

It knows nothing of transports. A surface gives it two steps per worker: ``open_on(worker)`` starts
the request and returns an :class:`Answer` once its status is known (nothing sent to the client yet,
so it can still be dropped), and ``deliver(answer)`` hands the answer to the client, returning what it
came to (:class:`~inference.accounting.Delivered`: not clean when the upstream broke off after the
response started, and the usage the answer reported). With the request's
:class:`~inference.kit.account.RequestAccount`, each attempt names its worker and the delivered
answer is recorded on it (the route closes it: docs/DECISIONS.md D66). Each attempt's outcome is recorded once, on
the worker's circuit breaker (which counts it in gw_worker_cb_outcomes_total itself). Under
--dp-aware each attempt on a worker with data-parallel ranks runs on one rank it takes
(:mod:`inference.routing.dp_ranks`): ``open_on`` gets the worker's handle with that ``dp_rank``.

A client's bad request is never the worker's failure: a worker's 4xx answer is delivered as it is
(not retried, not counted: :mod:`inference.routing.retry`, :mod:`inference.routing.breaker`), and an
engine's refusal of the request as invalid (``UpstreamFailure.rejected``: INVALID_ARGUMENT,
OUT_OF_RANGE) is answered 400 at once, counted as the answer it is, never as a failure.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Awaitable, Callable, Mapping, Protocol, TypeVar

from common import telemetry, tracing
from inference.accounting import Delivered
from inference.dataplane import DataPlane
from inference.errors import GatewayError
from inference.kit.account import RequestAccount
from inference.routing.dp_ranks import give_back, take_rank
from inference.routing.retry import RETRY_STATUSES
from inference.routing.selection import select_worker
from inference.routing.workers import WorkerHandle
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.pd_http import PdFailure
from inference.writers import ResponseClock

__all__ = ["Answer", "RoutePlan", "run_attempts", "run_turn"]

log = logging.getLogger(__name__)


class Answer(Protocol):
    """An upstream's answer whose status is known and nothing of which reached the client."""

    @property
    def status(self) -> int: ...

    async def discard(self) -> None: ...


A = TypeVar("A", bound=Answer)


@dataclass(slots=True)  # not frozen: a frozen __init__ sets each field through object.__setattr__ (D86)
class RoutePlan:
    """What choosing another worker needs, the same for every attempt of one request (never changed)."""

    endpoint: str  # the route, for metrics
    model: str | None
    routing_key: str | None
    body: Mapping[str, Any]  # the parsed request (cache_aware matches on its text)
    replay_bytes: int  # the size of what a retry sends again (--max-buffered-request-bytes)
    pinned: bool = False  # a later turn of one request: it runs on its worker, no other is tried
    # Who takes a retry, given the workers tried (default: the model's policy). Prefill/decode
    # disaggregation picks a new pair and answers its decode worker.
    pick_next: Callable[[frozenset[str]], WorkerHandle | None] | None = None


async def run_attempts(
    dp: DataPlane,
    plan: RoutePlan,
    route: telemetry.RouteTimer,
    clock: ResponseClock,
    first: WorkerHandle,
    open_on: Callable[[WorkerHandle], Awaitable[A]],
    deliver: Callable[[A], Awaitable[Delivered]],
    account: RequestAccount | None = None,
) -> None:
    """Raises the GatewayError to answer when no worker is left to try (502, 504, or what
    ``open_on`` raised); after ``deliver`` started the response it never raises one."""
    worker = first
    tried: list[str] = []
    retries = 0
    while True:
        if retries:  # back off before the next attempt, holding no worker's in-flight slot
            backoff = dp.retry.backoff_secs(retries)
            telemetry.record_retry(worker.record.worker_type, plan.endpoint, retries, backoff)
            await asyncio.sleep(backoff)
        tried.append(worker.id)
        if account is not None:
            account.worker = worker.url
        load = worker.load
        breaker = load.breaker
        load.in_flight += 1
        target = take_rank(worker)  # under --dp-aware, the data-parallel rank of this attempt
        span = None  # the attempt's span under --enable-trace: current while it runs (D74)
        if tracing.ENABLED:
            record = worker.record
            span = tracing.attempt_span(record.url, worker.id, str(record.transport), plan.model, len(tried))
            entered = tracing.enter(span)
        status = 0
        try:
            try:
                opening = perf_counter()
                try:
                    answer = await open_on(target)
                finally:
                    clock.upstream_secs += perf_counter() - opening
                status = answer.status
                route.upstream_status(status)
                if status in RETRY_STATUSES:
                    following = _next_worker(dp, plan, tried, retries)
                    if following is None:
                        if not plan.pinned:
                            telemetry.record_retries_exhausted(worker.record.worker_type, plan.endpoint)
                    else:
                        breaker.record(breaker.config.counts_as_failure(status))
                        await answer.discard()
                        log.info("worker %s answered %d; retrying on %s", worker.url, status, following.url)
                        worker, retries = following, retries + 1
                        continue
                delivered = await deliver(answer)
                if account is not None:
                    account.answered(status, delivered)
                breaker.record(not delivered.clean or breaker.config.counts_as_failure(status))
                return
            except UpstreamFailure as failure:
                if span is not None:
                    tracing.fail(span, "rejected" if failure.rejected else "timeout" if failure.timed_out
                                 else "upstream_error", failure.detail)
                if failure.rejected:  # the client's error: any worker would refuse it; the worker is fine
                    route.upstream_status(400)
                    breaker.record(False)  # an answer, as a relayed 4xx is
                    raise failure.to_error() from None
                record = worker.record
                telemetry.record_worker_error(record.worker_type, record.transport, failure.timed_out)
                if isinstance(failure, PdFailure) and failure.worker_id != worker.id:
                    # Its prefill partner failed (and was counted so): that one is not tried again,
                    # this decode worker may be, with another prefill worker.
                    tried[-1] = failure.worker_id
                else:
                    breaker.record(True)
                following = _next_worker(dp, plan, tried, retries)
                if following is None:
                    if not plan.pinned:
                        telemetry.record_retries_exhausted(record.worker_type, plan.endpoint)
                    raise failure.to_error() from None
                log.info("worker %s failed (%s); retrying on %s", worker.url, failure.detail, following.url)
                worker, retries = following, retries + 1
        finally:
            load.in_flight -= 1  # the worker of this attempt
            if target is not worker:
                give_back(target)
            if span is not None:
                tracing.leave(entered)
                tracing.end(span, status)


def run_turn(
    dp: DataPlane,
    worker: WorkerHandle,
    endpoint: str,
    clock: ResponseClock,
    open_on: Callable[[WorkerHandle], Awaitable[A]],
    deliver: Callable[[A], Awaitable[Delivered]],
    account: RequestAccount | None = None,
) -> Awaitable[None]:
    """A model turn a surface runs after its first (a tool round, a background run): through the same
    attempts loop, pinned to ``worker`` (where the request's earlier turns ran), so it is counted in the
    worker's in-flight load and its outcome recorded once on the worker's breaker, like any attempt.
    Raises the GatewayError of a failure (the worker's own, or its refusal of the turn as invalid).
    A turn is part of its request: the surface sums its usage into the request's answer; only a
    turn that is the request's run (a background run) passes the request's ``account``."""
    model = worker.record.model_id
    plan = RoutePlan(endpoint, model, None, {}, 0, pinned=True)
    route = telemetry.RouteTimer(endpoint, model, False, perf_counter())
    return run_attempts(dp, plan, route, clock, worker, open_on, deliver, account)


def _next_worker(dp: DataPlane, plan: RoutePlan, tried: list[str], retries: int) -> WorkerHandle | None:
    if plan.pinned or not dp.retry.allows(retries, plan.replay_bytes):
        return None
    if plan.pick_next is not None:
        try:
            return plan.pick_next(frozenset(tried))
        except GatewayError:
            return None
    try:
        return select_worker(
            dp.registry.snapshot, plan.model, dp.policies,
            routing_key=plan.routing_key, body=plan.body, exclude=frozenset(tried),
        ).worker
    except GatewayError:
        return None

"""Concurrency permits with a FIFO queue: fairness, queue full, timeout, release on cancellation."""

from __future__ import annotations

import asyncio

import pytest

from inference.admission.permits import PermitPool
from inference.errors import GatewayError


async def _queue(pool: PermitPool, order: list[int], index: int) -> None:
    await pool.acquire()
    order.append(index)


async def test_free_permits_are_taken_at_once() -> None:
    pool = PermitPool(2, 10, 1.0)
    await pool.acquire()
    await pool.acquire()
    assert pool.in_flight == 2
    pool.release()
    pool.release()
    assert pool.in_flight == 0


async def test_waiters_are_served_in_arrival_order() -> None:
    pool = PermitPool(1, 10, 5.0)
    await pool.acquire()
    order: list[int] = []
    tasks = [asyncio.create_task(_queue(pool, order, i)) for i in range(5)]
    await asyncio.sleep(0)
    assert pool.queued == 5
    for _ in range(5):
        pool.release()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    pool.release()
    assert pool.in_flight == 0 and pool.queued == 0


async def test_a_newcomer_never_overtakes_a_waiter() -> None:
    pool = PermitPool(1, 10, 5.0)
    await pool.acquire()
    order: list[int] = []
    waiter = asyncio.create_task(_queue(pool, order, 0))
    await asyncio.sleep(0)
    pool.release()  # handed to the waiter, which has not run yet
    newcomer = asyncio.create_task(_queue(pool, order, 1))
    await asyncio.sleep(0)
    await waiter
    assert order == [0]
    assert pool.queued == 1
    pool.release()
    await newcomer
    assert order == [0, 1]
    pool.release()
    assert pool.in_flight == 0


async def test_full_queue_is_refused_with_429() -> None:
    pool = PermitPool(1, 1, 5.0)
    await pool.acquire()
    queued = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as caught:
        await pool.acquire()
    assert caught.value.status == 429
    assert caught.value.code == "admission_queue_full"
    assert caught.value.error_type == "rate_limit_error"
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    pool.release()
    assert pool.in_flight == 0 and pool.queued == 0


async def test_queue_size_zero_refuses_at_once() -> None:
    pool = PermitPool(1, 0, 5.0)
    await pool.acquire()
    with pytest.raises(GatewayError) as caught:
        await pool.acquire()
    assert caught.value.code == "admission_queue_full"
    pool.release()
    assert pool.in_flight == 0


async def test_waiting_too_long_gives_503() -> None:
    pool = PermitPool(1, 5, 0.05)
    await pool.acquire()
    with pytest.raises(GatewayError) as caught:
        await pool.acquire()
    assert caught.value.status == 503
    assert caught.value.code == "admission_queue_timeout"
    assert caught.value.error_type == "service_unavailable"
    assert pool.queued == 0
    pool.release()
    assert pool.in_flight == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    pool = PermitPool(1, 5, 5.0)
    await pool.acquire()
    queued = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert pool.queued == 0
    pool.release()
    assert pool.in_flight == 0


async def test_permit_handed_to_a_cancelled_waiter_passes_on() -> None:
    pool = PermitPool(1, 5, 5.0)
    await pool.acquire()
    first = asyncio.create_task(pool.acquire())
    order: list[int] = []
    second = asyncio.create_task(_queue(pool, order, 1))
    await asyncio.sleep(0)
    pool.release()  # handed to ``first`` ...
    first.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert order == [1]
    assert pool.in_flight == 1 and pool.queued == 0
    pool.release()
    assert pool.in_flight == 0


async def test_a_patient_waiter_queues_past_the_queue_size_and_past_the_timeout_in_fifo_order() -> None:
    pool = PermitPool(1, 0, 0.05)  # no queue for others, and a short timeout
    await pool.acquire()
    with pytest.raises(GatewayError):
        await pool.acquire()  # an impatient one is refused at once
    order: list[str] = []

    async def patient(name: str) -> None:
        await pool.acquire(patient=True)
        order.append(name)

    first = asyncio.ensure_future(patient("first"))
    second = asyncio.ensure_future(patient("second"))
    await asyncio.sleep(0.1)  # twice the timeout: patient waiters are still there
    assert pool.queued == 2 and order == []
    pool.release()
    await first
    assert order == ["first"] and pool.in_flight == 1
    pool.release()
    await second
    assert order == ["first", "second"]
    pool.release()
    assert pool.in_flight == 0

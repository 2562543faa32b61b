"""Admission as one context manager: the permit and the media reservation are held inside it and
given back on every way out (normal exit, an error, a cancellation, a media wait that fails)."""

from __future__ import annotations

import asyncio

import pytest

from inference.admission import Admission, MediaBudget, PermitPool
from inference.errors import GatewayError


async def test_both_are_held_inside_and_released_after() -> None:
    permits, media = PermitPool(2, 0, 1.0), MediaBudget(100)
    async with Admission(permits, media, 40):
        assert permits.in_flight == 1 and media.in_use == 40
    assert permits.in_flight == 0 and media.in_use == 0


async def test_an_error_inside_releases_both() -> None:
    permits, media = PermitPool(1, 0, 1.0), MediaBudget(100)
    with pytest.raises(RuntimeError):
        async with Admission(permits, media, 10):
            raise RuntimeError("boom")
    assert permits.in_flight == 0 and media.in_use == 0


async def test_a_cancelled_request_releases_both() -> None:
    permits, media = PermitPool(1, 0, 1.0), MediaBudget(100)
    entered = asyncio.Event()

    async def request() -> None:
        async with Admission(permits, media, 10):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(request())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert permits.in_flight == 0 and media.in_use == 0


async def test_a_full_media_budget_gives_the_permit_back() -> None:
    permits, media = PermitPool(2, 0, 1.0), MediaBudget(100, wait_secs=0.05)
    async with Admission(permits, media, 90):
        with pytest.raises(GatewayError) as raised:
            async with Admission(permits, media, 20):
                pass
        assert raised.value.code == "multimodal_inflight_budget"
        assert permits.in_flight == 1  # only the first request's permit
    assert permits.in_flight == 0 and media.in_use == 0


async def test_limits_that_are_off_are_skipped() -> None:
    permits = PermitPool(1, 0, 1.0)
    async with Admission(None, None, 0):
        async with Admission(permits, None, 0):  # no media: only the permit
            assert permits.in_flight == 1
    assert permits.in_flight == 0

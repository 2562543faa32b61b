"""The in-flight media budget: counting inline media, 413 alone-too-large, FIFO waits, 429 when full."""

from __future__ import annotations

import asyncio

import pytest

from inference.admission.media import MediaBudget, inline_media_bytes
from inference.errors import GatewayError


def _chat(*parts: dict) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}


def _image(size_b64: int) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * size_b64}}


def test_inline_media_is_counted_at_decoded_size() -> None:
    body = _chat(
        _image(400),
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + "A" * 800}},
        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + "A" * 40}},
        {"type": "input_audio", "input_audio": {"data": "A" * 80, "format": "wav"}},
    )
    assert inline_media_bytes(body) == 300 + 600 + 30 + 60


def test_remote_urls_and_text_cost_nothing() -> None:
    body = _chat({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}})
    assert inline_media_bytes(body) == 0
    assert inline_media_bytes({"messages": [{"role": "user", "content": "plain"}]}) == 0
    assert inline_media_bytes({"prompt": "no messages"}) == 0


def test_media_alone_over_the_budget_is_413() -> None:
    budget = MediaBudget(100)
    with pytest.raises(GatewayError) as caught:
        budget.measure(_chat(_image(400)))
    assert caught.value.status == 413
    assert caught.value.code == "multimodal_payload_too_large"
    assert budget.measure(_chat(_image(100))) == 75


async def test_reservations_wait_in_order_and_are_released() -> None:
    budget = MediaBudget(100, wait_secs=5.0)
    await budget.reserve(80)
    order: list[int] = []

    async def reserve(index: int, size: int) -> None:
        await budget.reserve(size)
        order.append(index)

    first = asyncio.create_task(reserve(0, 60))
    second = asyncio.create_task(reserve(1, 10))  # fits, but must not overtake the first
    await asyncio.sleep(0)
    assert order == [] and budget.queued == 2
    budget.release(80)
    await asyncio.gather(first, second)
    assert order == [0, 1]
    assert budget.in_use == 70
    budget.release(60)
    budget.release(10)
    assert budget.in_use == 0 and budget.queued == 0


async def test_budget_that_stays_full_gives_429() -> None:
    budget = MediaBudget(100, wait_secs=0.05)
    await budget.reserve(90)
    with pytest.raises(GatewayError) as caught:
        await budget.reserve(20)
    assert caught.value.status == 429
    assert caught.value.code == "multimodal_inflight_budget"
    assert budget.queued == 0
    budget.release(90)
    assert budget.in_use == 0


async def test_cancelled_reservation_frees_the_queue() -> None:
    budget = MediaBudget(100, wait_secs=5.0)
    await budget.reserve(90)
    big = asyncio.create_task(budget.reserve(50))
    small = asyncio.create_task(budget.reserve(5))
    await asyncio.sleep(0)
    big.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big
    await small  # the head left, so the small one fits now
    assert budget.in_use == 95
    budget.release(90)
    budget.release(5)
    assert budget.in_use == 0 and budget.queued == 0


async def test_a_processs_share_admits_a_larger_request_when_alone() -> None:
    """A serving process's share of a 100-byte budget is 50; a 70-byte request (within the whole
    budget) waits until its process holds no other media, then goes through."""
    budget = MediaBudget(50, wait_secs=0.2, request_limit=100)
    assert budget.measure({"messages": []}) == 0
    await budget.reserve(10)
    with pytest.raises(GatewayError) as raised:
        await budget.reserve(70)
    assert raised.value.code == "multimodal_inflight_budget"
    budget.release(10)
    await budget.reserve(70)
    assert budget.in_use == 70


async def test_a_request_adds_to_what_it_holds_alone_or_waits_for_the_others() -> None:
    """A gRPC EPD request reserves its encoder input on top of the inline bytes it holds (D91): alone,
    it may go past the budget with them; beside another request's bytes it waits, then gets 429."""
    budget = MediaBudget(100, wait_secs=0.05)
    await budget.reserve(30)  # this request's inline bytes
    await budget.reserve(150, held=30)  # its tensors: no one else holds media
    assert budget.in_use == 180
    budget.release(150)
    await budget.reserve(40)  # another request
    with pytest.raises(GatewayError) as full:
        await budget.reserve(50, held=30)
    assert full.value.code == "multimodal_inflight_budget" and budget.in_use == 70
    waiting = asyncio.create_task(budget.reserve(50, held=30))
    await asyncio.sleep(0)
    budget.release(40)  # the other request ends: this one is alone again
    await waiting
    assert budget.in_use == 80

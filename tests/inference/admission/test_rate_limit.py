"""Per-tenant rate limits: in-process counter, the shared Redis counter, and failing open."""

from __future__ import annotations

import logging
import time
import uuid
from typing import AsyncIterator

import pytest

from inference.admission.rate_limit import (
    LocalRateLimiter,
    RateDecision,
    RedisRateLimiter,
    TenantLimits,
    build_rate_limiter,
)

REDIS_URL = "redis://127.0.0.1:6379/0"


def _redis_available() -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


needs_redis = pytest.mark.skipif(not _redis_available(), reason="no Redis on 127.0.0.1:6379")


def test_limits_per_tenant_fall_back_to_the_default() -> None:
    limits = TenantLimits(10, (("acme", "3"),))
    assert limits.limit_for("acme") == 3
    assert limits.limit_for("globex") == 10
    assert TenantLimits(0, (("acme", "0"),)).any is False
    assert build_rate_limiter(0, (), None) is None
    assert isinstance(build_rate_limiter(0, (("acme", "5"),), None), LocalRateLimiter)
    assert isinstance(build_rate_limiter(5, (), "redis://127.0.0.1:6379/0"), RedisRateLimiter)


async def test_local_limiter_refuses_past_the_limit() -> None:
    limiter = LocalRateLimiter(TenantLimits(0, (("acme", "2"),)))
    first = await limiter.hit("acme")
    second = await limiter.hit("acme")
    third = await limiter.hit("acme")
    assert first is not None and first.allowed and first.remaining == 1
    assert second is not None and second.allowed and second.remaining == 0
    assert third is not None and not third.allowed and third.remaining == 0
    assert await limiter.hit("globex") is None  # no limit for globex
    assert third.reset_at % 60 == 0 and third.reset_at > time.time()


def test_refusal_headers_carry_retry_after() -> None:
    decision = RateDecision(False, 5, 0, 1_000_060)
    headers = dict(decision.headers(now=1_000_030.5))
    assert headers == {
        b"retry-after": b"30",
        b"x-ratelimit-limit": b"5",
        b"x-ratelimit-remaining": b"0",
        b"x-ratelimit-reset": b"1000060",
    }
    assert b"retry-after" not in dict(RateDecision(True, 5, 4, 1_000_060).headers())


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    prefix = f"gw:test:rl:{uuid.uuid4().hex}:"
    yield prefix
    import redis.asyncio as aredis

    client = aredis.Redis.from_url(REDIS_URL)
    keys = [key async for key in client.scan_iter(match=prefix + "*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@needs_redis
async def test_redis_limiter_counts_in_redis(redis_prefix: str) -> None:
    limiter = RedisRateLimiter(TenantLimits(3, ()), REDIS_URL, prefix=redis_prefix)
    try:
        decisions = [await limiter.hit("acme") for _ in range(4)]
    finally:
        await limiter.aclose()
    assert [d.allowed for d in decisions if d is not None] == [True, True, True, False]
    assert [d.remaining for d in decisions if d is not None] == [2, 1, 0, 0]


@needs_redis
async def test_two_limiters_share_one_budget_through_redis(redis_prefix: str) -> None:
    limits = TenantLimits(0, (("acme", "4"),))
    one = RedisRateLimiter(limits, REDIS_URL, prefix=redis_prefix)
    two = RedisRateLimiter(limits, REDIS_URL, prefix=redis_prefix)
    try:
        allowed = []
        for limiter in (one, two, one, two, one, two):
            decision = await limiter.hit("acme")
            assert decision is not None
            allowed.append(decision.allowed)
    finally:
        await one.aclose()
        await two.aclose()
    assert allowed == [True, True, True, True, False, False]


async def test_redis_down_fails_open_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RedisRateLimiter(TenantLimits(1, ()), "redis://127.0.0.1:1/0", prefix="gw:test:down:")
    caplog.set_level(logging.WARNING, logger="inference.admission.rate_limit")
    try:
        results = [await limiter.hit("acme") for _ in range(5)]
    finally:
        await limiter.aclose()
    assert results == [None] * 5  # let through
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1

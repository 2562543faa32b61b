"""Per-tenant rate limits: in-process counter, the shared Redis counter, failing open to the local
count when Redis is cut, how stored limits combine with the flags, and the runtime following limits
that come, change and go."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import AsyncIterator

import pytest

from common.outages import REDIS
from inference.admission.rate_limit import (
    LocalRateLimiter,
    RateDecision,
    RedisRateLimiter,
    TenantLimits,
    refit_rate_limiter,
)
from common.config import GatewayConfig
from inference.dataplane import DataPlane
from tests.conftest import until
from tests.faults import FaultProxy
from tests.redis_server import RedisServer, needs_redis_server

REDIS_URL = "redis://127.0.0.1:6379/0"


def _redis_available() -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


needs_redis = pytest.mark.skipif(not _redis_available(), reason="no Redis on 127.0.0.1:6379")


def test_limits_per_tenant_fall_back_to_the_default(settings) -> None:
    limits = TenantLimits(10, (("acme", "3"),))
    assert limits.limit_for("acme") == 3
    assert limits.limit_for("globex") == 10
    assert TenantLimits(0, (("acme", "0"),)).any is False
    settings.REDIS_URL = None
    assert DataPlane.build(GatewayConfig()).rate_limiter is None
    assert isinstance(DataPlane.build(GatewayConfig(tenant_rate_limits=(("acme", "5"),))).rate_limiter, LocalRateLimiter)
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    assert isinstance(DataPlane.build(GatewayConfig(default_tenant_rate_limit=5)).rate_limiter, RedisRateLimiter)


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


@needs_redis
async def test_redis_cut_counts_in_the_process_and_recovers(
    redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis cut under a limiter (a proxy of ours resets its connections and refuses new ones): the
    limit still holds, counted in this process (fail open to the local count, never refused for the
    outage), the outage is logged once each way, and counting returns to Redis when it does."""
    caplog.set_level(logging.WARNING, logger="common.outages")
    with FaultProxy("127.0.0.1", 6379) as proxy:
        limiter = RedisRateLimiter(TenantLimits(0, (("acme", "2"), ("globex", "9"))), proxy.url("redis", "/0"),
                                   prefix=redis_prefix)
        try:
            before = await limiter.hit("globex")
            assert before is not None and before.remaining == 8  # counted in Redis
            proxy.cut()
            during = [await limiter.hit("acme") for _ in range(6)]
            assert [d.allowed for d in during if d is not None] == [True, True, False, False, False, False]
            proxy.restore()
            await asyncio.sleep(REDIS.retry_secs + 0.1)
            after = await limiter.hit("globex")
        finally:
            await limiter.aclose()
            REDIS.recovered()  # whatever happened, later tests start with Redis up
    assert after is not None and after.remaining == (7 if after.reset_at == before.reset_at else 8)
    assert not REDIS.down
    lines = [r.getMessage() for r in caplog.records if r.name == "common.outages"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Redis unavailable (") and "counted in each process alone" in lines[0]
    assert lines[1].startswith("Redis reachable again after")


@needs_redis_server
async def test_two_limiters_share_one_budget_again_within_seconds_of_redis_return(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two limiters standing for two gateway processes (each its own connections and its own count of
    an outage) over a Redis of the test's own, killed and started again on its port (empty: nothing
    is saved). While it is gone each counts alone; within seconds of its return they count one budget
    again, the first command on each limiter's pooled connection (which Redis dropped) included, and
    what each let through during the outage is part of that minute's budget."""
    caplog.set_level(logging.WARNING, logger="common.outages")
    limits = TenantLimits(0, (("acme", "10"), ("probe", "1000000")))
    with RedisServer() as server:
        one = RedisRateLimiter(limits, server.url())
        two = RedisRateLimiter(limits, server.url())
        try:
            before = [await limiter.hit("acme") for limiter in (one, two)]  # each holds a pooled connection
            assert [d.remaining for d in before if d is not None] == [9, 8]  # shared
            server.kill()
            during = [await limiter.hit("acme") for limiter in (one, two, one, two)]
            assert REDIS.down
            server.start()

            async def counting_in_redis() -> bool:
                await one.hit("probe")
                return not REDIS.down

            await until(counting_in_redis, timeout=REDIS.retry_secs + 4.0)
            after = [await limiter.hit("acme") for limiter in (one, two) * 6]
        finally:
            await one.aclose()
            await two.aclose()
            REDIS.recovered()  # whatever happened, later tests start with Redis up
    assert all(d is not None for d in during + after)
    decided = [d for d in during + after if d is not None]
    assert [d.remaining for d in decided[:4]] == [9, 9, 8, 8]  # each counted alone, allowed: fail open
    remaining = [d.remaining for d in decided[4:]]
    allowed = [d.allowed for d in decided[4:]]
    if len({d.reset_at for d in decided}) == 1:  # the outage and the return in one minute's window
        # Redis came back empty: the 2 + 2 of the outage are added to it, then one count for both.
        assert remaining == [7, 4, 3, 2, 1, 0] + [0] * 6
        assert allowed == [True] * 6 + [False] * 6
    else:  # a new minute began on the way: the new window is counted once, by both
        last = [d for d in decided[4:] if d.reset_at == decided[-1].reset_at]
        assert [d.remaining for d in last][:10] == list(range(9, 9 - len(last[:10]), -1))
    lines = [r.getMessage() for r in caplog.records if r.name == "common.outages"]
    assert len(lines) == 2, lines  # one outage: the dropped pooled connections did not open another
    assert lines[0].startswith("Redis unavailable (") and lines[1].startswith("Redis reachable again after")


def test_a_stored_row_overrides_the_flag_and_the_default_covers_the_rest() -> None:
    limits = TenantLimits.combine(10, (("acme", "3"), ("globex", "7")), {"acme": 5, "initech": 0})
    assert limits.limit_for("acme") == 5  # the row wins over --tenant-rate-limit acme=3
    assert limits.limit_for("globex") == 7  # flag only
    assert limits.limit_for("initech") == 0  # a stored 0: unlimited despite the default
    assert limits.limit_for("umbrella") == 10  # neither: --default-tenant-rate-limit
    assert TenantLimits.combine(0, (), {}) == TenantLimits(0, ())
    assert TenantLimits.combine(0, (("acme", "3"),), {"acme": 0}).any is False


async def test_refitting_keeps_the_limiter_and_its_count() -> None:
    limiter = refit_rate_limiter(None, TenantLimits(0, (("acme", 2),)), None)
    assert isinstance(limiter, LocalRateLimiter)
    first = await limiter.hit("acme")
    assert first is not None and first.remaining == 1
    assert refit_rate_limiter(limiter, TenantLimits(0, (("acme", 5),)), None) is limiter
    second = await limiter.hit("acme")
    assert second is not None and second.limit == 5
    # Same minute window: the count carried on (a new window would start from 1).
    assert second.remaining == (3 if second.reset_at == first.reset_at else 4)
    assert isinstance(refit_rate_limiter(None, TenantLimits(1, ()), REDIS_URL), RedisRateLimiter)


async def test_runtime_follows_limits_that_appear_change_and_disappear() -> None:
    rt = DataPlane.build(GatewayConfig(tenant_rate_limits=(("globex", "9"),)))
    flag_limiter = rt.rate_limiter
    assert flag_limiter is not None and rt.tenant_limits.limit_for("acme") == 0
    rt.install_tenant_limits({"acme": 2})  # a row appears
    assert rt.rate_limiter is flag_limiter and rt.tenant_limits.limit_for("acme") == 2
    rt.install_tenant_limits({"acme": 0, "globex": 0})  # rows exempt both: nothing left to count
    assert rt.rate_limiter is None

    bare = DataPlane.build(GatewayConfig())
    assert bare.rate_limiter is None  # no flags, no rows: the relay's one None check
    bare.install_tenant_limits({"acme": 1})
    limiter = bare.rate_limiter
    assert limiter is not None
    allowed = await limiter.hit("acme")
    refused = await limiter.hit("acme")
    assert allowed is not None and allowed.allowed
    assert refused is not None and refused.allowed is (refused.reset_at != allowed.reset_at)
    bare.install_tenant_limits({"acme": 3})  # changed in place
    assert bare.rate_limiter is limiter and bare.tenant_limits.limit_for("acme") == 3
    bare.install_tenant_limits({})  # the row is deleted
    assert bare.rate_limiter is None
    bare.install_tenant_limits({"acme": 4})  # and added again: the same limiter comes back
    assert bare.rate_limiter is limiter
    await bare.aclose()
    await rt.aclose()


def test_processes_that_count_apart_each_enforce_their_part() -> None:
    limits = TenantLimits.combine(5, [("acme", "9"), ("free", "0")], {"globex": 3}, share=2)
    assert (limits.default, limits.limit_for("acme"), limits.limit_for("globex"), limits.limit_for("free")) == (3, 5, 2, 0)
    assert TenantLimits.combine(5, [("acme", "9")], {}, share=1).limit_for("acme") == 9

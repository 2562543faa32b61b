"""Token budgets per tenant (issue 25 item 5): the flags, how rows and flags combine, the count per UTC
day and calendar month on an injected clock (no waiting for a real boundary), the refusal through the
relay with the spec's envelope, code and Retry-After, the shared key and open mode never budgeted,
and two counters standing for two gateway processes sharing one budget through a real Redis."""

from __future__ import annotations

import calendar
import logging
import time
import uuid
from typing import Any

import httpx
import pytest
import redis

from common.config import ConfigError, GatewayConfig, parse_gateway_args
from common.outages import REDIS
from inference.accounting import OPEN_SCOPE, SHARED_SCOPE, AccountingEntry, Outcome, TokenUsage
from inference.admission.budgets import (
    Budget,
    LocalBudgetCounter,
    RedisBudgetCounter,
    TenantBudgets,
    current_period,
    refit_budget_counter,
)
from inference.dataplane import DataPlane, data_plane
from tests.conftest import RunningWorker, record_for, until
from tests.redis_server import RedisServer, needs_redis_server

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}


def utc(*parts: int) -> float:
    return float(calendar.timegm((*parts, *(0,) * (6 - len(parts)))))


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def budgets(**by_tenant: str) -> TenantBudgets:
    return TenantBudgets.combine("0/day", by_tenant.items(), {})


def entry(tenant: str, prompt: int, completion: int, at: float) -> AccountingEntry:
    return AccountingEntry(
        at=at, request_id=uuid.uuid4().hex, tenant=tenant, model="mock-model", worker="", surface="chat",
        route="/v1/chat/completions", status=200, outcome=Outcome.SUCCESS, usage=TokenUsage(prompt, completion),
    )


# --- the flags -------------------------------------------------------------------------------------


def test_budget_flags_parse() -> None:
    config = parse_gateway_args([
        "--tenant-budget", "acme=100000/day", "--tenant-budget", "globex=007/month",
        "--default-tenant-budget", "5000/month",
    ])
    assert config.tenant_budgets == (("acme", "100000/day"), ("globex", "7/month"))
    assert config.default_tenant_budget == "5000/month"
    assert GatewayConfig().default_tenant_budget == "0/day"  # no budget unless asked


def test_budget_flags_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TENANT_BUDGETS", "acme=10/day,globex=20/month")
    monkeypatch.setenv("GW_DEFAULT_TENANT_BUDGET", "30/day")
    config = parse_gateway_args([])
    assert config.tenant_budgets == (("acme", "10/day"), ("globex", "20/month"))
    assert config.default_tenant_budget == "30/day"
    monkeypatch.setenv("GW_DEFAULT_TENANT_BUDGET", "30/week")
    with pytest.raises(ConfigError, match="GW_DEFAULT_TENANT_BUDGET"):
        parse_gateway_args([])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tenant-budget", "acme=1000"], "expected TOKENS/day or TOKENS/month, got '1000'"),
        (["--tenant-budget", "acme=1000/week"], "got '1000/week'"),
        (["--tenant-budget", "acme=ten/day"], "got 'ten/day'"),
        (["--tenant-budget", "acme=1.5/day"], "got '1.5/day'"),
        (["--tenant-budget", "acme=1000/Day"], "got '1000/Day'"),
        (["--tenant-budget", "=1000/day"], "expected tenant=TOKENS/day|month"),
        (["--tenant-budget", "acme"], "expected tenant=TOKENS/day|month"),
        (["--default-tenant-budget", "1000"], "expected TOKENS/day or TOKENS/month"),
        (["--default-tenant-budget", "/day"], "got '/day'"),
        (["--default-tenant-budget", "-5/day"], "--default-tenant-budget"),
    ],
)
def test_malformed_budget_flags_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("|", r"\|")):
        parse_gateway_args(argv)


# --- where a tenant's budget comes from ------------------------------------------------------------


def test_a_stored_row_overrides_the_flag_and_the_default_covers_the_rest() -> None:
    found = TenantBudgets.combine(
        "1000/day", (("acme", "300/day"), ("globex", "700/month")), {"acme": "50/month", "initech": "0/day"}
    )
    assert found.budget_for("acme") == Budget(50, "month")  # the row wins over --tenant-budget acme=300/day
    assert found.budget_for("globex") == Budget(700, "month")  # flag only
    assert found.budget_for("initech") is None  # a stored 0: unlimited despite the default
    assert found.budget_for("umbrella") == Budget(1000, "day")  # neither: --default-tenant-budget
    assert found.budget_for(SHARED_SCOPE) is None and found.budget_for(OPEN_SCOPE) is None  # never budgeted
    assert TenantBudgets.combine("0/month", (("acme", "3/day"),), {"acme": "0/day"}).any is False
    assert TenantBudgets.combine("0/day", (), {}) == TenantBudgets(Budget(0, "day"), ())


def test_periods_are_utc_days_and_calendar_months() -> None:
    assert current_period("day", utc(2026, 11, 28, 23, 59, 59)) == ("day:2026-11-28", utc(2026, 11, 29))
    assert current_period("day", utc(2026, 11, 29)) == ("day:2026-11-29", utc(2026, 11, 30))
    assert current_period("month", utc(2026, 2, 14, 12)) == ("month:2026-02", utc(2026, 3, 1))
    assert current_period("month", utc(2026, 12, 31, 23, 59, 59)) == ("month:2026-12", utc(2027, 1, 1))


# --- counting on one process's clock ---------------------------------------------------------------


def test_used_up_budget_is_refused_with_retry_after_to_the_day_end() -> None:
    clock = Clock(utc(2026, 11, 28, 22, 30))
    counter = LocalBudgetCounter(budgets(acme="100/day"), clock)
    assert counter.check("acme") is None
    counter.charge("acme", 60, clock.now)
    assert counter.check("acme") is None and counter.used("acme") == 60
    counter.charge("acme", 40, clock.now)  # exactly the budget: nothing left
    refused = counter.check("acme")
    assert refused is not None
    assert (refused.used, refused.budget, refused.resets_at) == (100, Budget(100, "day"), utc(2026, 11, 29))
    assert refused.retry_after == 90 * 60  # 22:30 -> midnight UTC
    clock.now = utc(2026, 11, 28, 23, 59, 59) + 0.25
    last = counter.check("acme")
    assert last is not None and last.retry_after == 1
    assert counter.check("globex") is None  # no budget of its own and no default


def test_a_new_day_makes_the_budget_available_again() -> None:
    clock = Clock(utc(2026, 11, 28, 23, 59))
    counter = LocalBudgetCounter(budgets(acme="10/day"), clock)
    counter.charge("acme", 25, clock.now)  # a request already running finished over the budget
    assert counter.check("acme") is not None
    clock.now = utc(2026, 11, 29, 0, 0, 1)
    assert counter.check("acme") is None and counter.used("acme") == 0
    # A request that arrived before midnight and ends after it counts for the day it arrived in.
    counter.charge("acme", 7, utc(2026, 11, 28, 23, 59, 58))
    assert counter.used("acme") == 0
    counter.charge("acme", 10, clock.now)
    assert counter.check("acme") is not None


def test_a_new_month_makes_the_budget_available_again() -> None:
    clock = Clock(utc(2026, 12, 1, 0, 0, 5))
    counter = LocalBudgetCounter(budgets(acme="1000/month"), clock)
    counter.charge("acme", 600, clock.now)
    clock.now = utc(2026, 12, 31, 23, 0)  # the same month: the days add up
    counter.charge("acme", 400, clock.now)
    refused = counter.check("acme")
    assert refused is not None and refused.resets_at == utc(2027, 1, 1) and refused.retry_after == 3600
    clock.now = utc(2027, 1, 1, 0, 0, 0)
    assert counter.check("acme") is None and counter.used("acme") == 0


def test_refitting_keeps_the_counter_and_the_period_count() -> None:
    clock = Clock(utc(2026, 11, 28, 12))
    counter = LocalBudgetCounter(budgets(acme="100/day"), clock)
    counter.charge("acme", 80, clock.now)
    assert refit_budget_counter(counter, budgets(acme="50/day"), None) is counter  # a row lowered it
    assert counter.check("acme") is not None
    refit_budget_counter(counter, budgets(acme="200/day"), None)  # and raised it again
    assert counter.check("acme") is None and counter.used("acme") == 80
    assert isinstance(refit_budget_counter(None, budgets(acme="1/day"), None), LocalBudgetCounter)
    assert isinstance(refit_budget_counter(None, budgets(acme="1/day"), "redis://127.0.0.1:1/0"), RedisBudgetCounter)


async def test_data_plane_charges_finished_requests_and_follows_rows(settings: Any) -> None:
    settings.REDIS_URL = None
    plane = DataPlane.build(GatewayConfig(tenant_budgets=(("acme", "100/day"),), default_tenant_budget="10/day"))
    counter = plane.budgets
    assert isinstance(counter, LocalBudgetCounter)
    now = time.time()
    plane.account(entry("acme", 70, 30, now))  # prompt plus completion: 100
    plane.account(entry(SHARED_SCOPE, 5000, 5000, now))
    plane.account(entry(OPEN_SCOPE, 5000, 5000, now))
    assert counter.check("acme") is not None
    assert counter.used(SHARED_SCOPE) is None and counter.check(SHARED_SCOPE) is None  # recorded, never budgeted
    assert plane.ledger.drain().minutes  # the ledger still has every request

    plane.install_tenant_budgets({"acme": "1000/day"})  # a console row overrides the flag
    assert plane.budgets is counter and counter.check("acme") is None and counter.used("acme") == 100
    plane.install_tenant_budgets({"acme": "0/day"})  # a stored 0 exempts it (the default still counts others)
    assert plane.tenant_budgets.budget_for("acme") is None and plane.budgets is counter
    plane.install_tenant_budgets({})  # the row is deleted: the flag again
    assert plane.tenant_budgets.budget_for("acme") == Budget(100, "day")

    bare = DataPlane.build(GatewayConfig())
    assert bare.budgets is None  # no budgets anywhere: admission's one None check
    bare.account(entry("acme", 1, 1, now))  # and accounting charges nothing
    bare.install_tenant_budgets({"acme": "5/month"})
    assert isinstance(bare.budgets, LocalBudgetCounter)
    bare.install_tenant_budgets({})
    assert bare.budgets is None
    await bare.aclose()
    await plane.aclose()


# --- the refusal on the wire -----------------------------------------------------------------------


async def test_tenant_over_its_budget_gets_429_budget_exceeded_and_the_shared_key_never(
    make_gateway: Any, worker: RunningWorker
) -> None:
    tenant, other = f"budget-{uuid.uuid4().hex[:10]}", f"budget-{uuid.uuid4().hex[:10]}"
    key, other_key, shared = f"sk-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"
    gateway: httpx.AsyncClient = make_gateway(
        [record_for(worker)], api_key=shared, tenant_api_keys=((tenant, key), (other, other_key)),
        default_tenant_budget="50/day",
    )
    headers = {"Authorization": f"Bearer {key}"}
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
    dp = data_plane()
    at = time.time()
    dp.account(entry(tenant, 30, 20, at))  # finished requests of this tenant used the day's 50 tokens
    dp.account(entry(SHARED_SCOPE, 10_000, 10_000, at))  # the shared key used far more than any budget

    paths = [("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "mock-model", "prompt": "hi"}),
             ("/v1/messages", {"model": "mock-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
             ("/v1/responses", {"model": "mock-model", "input": "hi"}),
             ("/v1/embeddings", {"model": "mock-model", "input": "hi"}), ("/generate", {"text": "hi"})]
    for path, body in paths:
        refused = await gateway.post(path, json=body, headers=headers)
        assert refused.status_code == 429, (path, refused.text)
        assert refused.headers["x-gw-error-code"] == "budget_exceeded"
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "budget_exceeded")
        assert "budget" in error["message"] and "day" in error["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 86_400
    shared_headers = {"Authorization": f"Bearer {shared}"}
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=shared_headers)).status_code == 200
    other_headers = {"Authorization": f"Bearer {other_key}"}
    assert (await gateway.post("/v1/chat/completions", json=CHAT, headers=other_headers)).status_code == 200


async def test_open_mode_is_never_budgeted(make_gateway: Any, worker: RunningWorker) -> None:
    gateway: httpx.AsyncClient = make_gateway([record_for(worker)], default_tenant_budget="1/day")
    dp = data_plane()
    assert dp.budgets is not None
    dp.account(entry(OPEN_SCOPE, 500, 500, time.time()))
    assert (await gateway.post("/v1/chat/completions", json=CHAT)).status_code == 200


# --- one budget across processes through Redis -----------------------------------------------------


@needs_redis_server
async def test_two_counters_share_one_budget_through_redis() -> None:
    """Two counters standing for two gateway processes (or hosts): each sees its own charges at
    once and the other's after a sync; the counter in Redis is the exact sum; a new day starts from
    zero for both."""
    clock = Clock(utc(2026, 11, 28, 12))
    limits = budgets(acme="100/day", globex="1000/month")
    with RedisServer() as server:
        one = RedisBudgetCounter(limits, server.url(), clock=clock, run_syncs=False)
        two = RedisBudgetCounter(limits, server.url(), clock=clock, run_syncs=False)
        try:
            assert one.check("acme") is None and two.check("acme") is None
            one.charge("acme", 60, clock.now)
            two.charge("acme", 30, clock.now)
            assert (one.used("acme"), two.used("acme")) == (60, 30)  # each knows its own at once
            await one.sync()
            await two.sync()
            assert two.used("acme") == 90 and two.check("acme") is None
            two.charge("acme", 10, clock.now)
            assert two.check("acme") is not None  # used up, seen here at once
            assert one.check("acme") is None  # not seen yet: within one sync of the other process
            await two.sync()
            await one.sync()
            refused = one.check("acme")
            assert refused is not None and refused.used == 100 and refused.retry_after == 12 * 3600
            stored = redis.Redis.from_url(server.url()).get("gw:budget:acme:day:2026-11-28")
            assert stored == b"100"  # every charge of both, once

            clock.now = utc(2026, 11, 29, 0, 0, 1)  # the day rolls over: available again for both
            assert one.check("acme") is None and two.check("acme") is None
            one.charge("acme", 5, clock.now)
            await one.sync()
            await two.sync()
            assert two.used("acme") == 5
        finally:
            await one.aclose()
            await two.aclose()


@needs_redis_server
async def test_charges_held_through_a_redis_outage_are_counted_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis killed: the process goes on counting its own charges (never refusing for the outage),
    holds them, and sends them once Redis is back; a batch whose answer was lost after Redis applied
    it is sent again and counted once."""
    caplog.set_level(logging.WARNING, logger="common.outages")
    monkeypatch.setattr(REDIS, "retry_secs", 0.0)  # every sync may try Redis (no waiting in the test)
    clock = Clock(utc(2026, 11, 28, 12))
    with RedisServer() as server:
        counter = RedisBudgetCounter(budgets(acme="100/day"), server.url(), clock=clock, run_syncs=False)
        stored = redis.Redis.from_url(server.url())
        try:
            counter.charge("acme", 40, clock.now)
            await counter.sync()
            server.kill()
            counter.charge("acme", 30, clock.now)
            await counter.sync()  # fails: held
            assert REDIS.down and counter.used("acme") == 70 and counter.check("acme") is None
            counter.charge("acme", 30, clock.now)
            assert counter.check("acme") is not None  # its own use still counts against the budget
            await counter.sync()
            server.start()  # empty: a Redis without persistence
            await counter.sync()  # the batch held since the outage began (30)
            await counter.sync()  # then what came after it (30)
            assert not REDIS.down
            assert stored.get("gw:budget:acme:day:2026-11-28") == b"60"
            assert counter.used("acme") == 60

            # The answer to a batch is lost after Redis applied it: the same batch is sent again.
            real = counter._script

            def losing_answers() -> Any:
                script = real()

                async def applied_then_lost(**kwargs: Any) -> Any:
                    await script(**kwargs)
                    raise redis.ConnectionError("connection lost before the answer")

                return applied_then_lost

            counter.charge("acme", 25, clock.now)
            monkeypatch.setattr(counter, "_script", losing_answers)
            await counter.sync()
            assert counter.used("acme") == 85  # held: still counted here
            monkeypatch.setattr(counter, "_script", real)
            await counter.sync()
            assert stored.get("gw:budget:acme:day:2026-11-28") == b"85"  # once, not twice
            assert counter.used("acme") == 85
        finally:
            await counter.aclose()
            stored.close()
            REDIS.recovered()  # whatever happened, later tests start with Redis up
    lines = [r.getMessage() for r in caplog.records if r.name == "common.outages"]
    assert lines[0].startswith("Redis unavailable (")


@needs_redis_server
async def test_syncs_run_off_the_request_path_while_tenants_are_served() -> None:
    """With its sync task on: a check starts it, charges reach Redis without anyone awaiting them,
    and another process's counter sees them."""
    with RedisServer() as server:
        one = RedisBudgetCounter(budgets(acme="100/day"), server.url(), sync_secs=0.05)
        two = RedisBudgetCounter(budgets(acme="100/day"), server.url(), sync_secs=0.05)
        try:
            one.charge("acme", 100, time.time())

            async def seen() -> bool:
                return two.check("acme") is not None

            await until(seen, timeout=10)
        finally:
            await one.aclose()
            await two.aclose()


@needs_redis_server
async def test_near_its_budget_a_tenant_is_synced_at_once_and_then_often() -> None:
    """Pauses of an hour between syncs: only the near-budget pace can bring the charges and counts
    across in this test. A charge taking the tenant to 90 % ends the charging process's pause and
    is sent at once; the other process, whose view shows it near, reads it every few milliseconds
    and refuses the tenant once the first process's charges take it past its budget."""
    with RedisServer() as server:
        kwargs: dict[str, Any] = {"sync_secs": 3600.0, "near_sync_secs": 0.01}
        one = RedisBudgetCounter(budgets(acme="100/day"), server.url(), **kwargs)
        two = RedisBudgetCounter(budgets(acme="100/day"), server.url(), **kwargs)
        stored = redis.Redis.from_url(server.url())
        key = f"gw:budget:acme:{current_period('day', time.time())[0]}"
        try:
            one.charge("acme", 10, time.time())  # starts one's task: sent at once, then an hour's pause

            async def stored_count(count: int) -> bool:
                return int(stored.get(key) or 0) == count

            await until(lambda: stored_count(10))
            one.charge("acme", 85, time.time())  # 95 %: the pause ends
            await until(lambda: stored_count(95))

            assert two.check("acme") is None  # starts two's task: its first sync reads 95

            async def near_in_two() -> bool:
                return two.used("acme") == 95

            await until(near_in_two)
            assert two.check("acme") is None  # near: two syncs often from now on
            one.charge("acme", 10, time.time())

            async def refused_in_two() -> bool:
                return two.check("acme") is not None

            await until(refused_in_two)
        finally:
            await one.aclose()
            await two.aclose()
            stored.close()


async def test_a_finished_requests_tokens_use_up_the_budget(make_gateway: Any, worker: RunningWorker) -> None:
    """Through the accounting of a real answer: the first request is admitted under budget and
    finishes; its prompt and completion tokens are charged as it ends and the next one is refused."""
    tenant, key = f"budget-{uuid.uuid4().hex[:10]}", f"sk-{uuid.uuid4().hex}"
    gateway: httpx.AsyncClient = make_gateway(
        [record_for(worker)], tenant_api_keys=((tenant, key),), tenant_budgets=((tenant, "1/day"),),
    )
    headers = {"Authorization": f"Bearer {key}"}
    first = await gateway.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert first.status_code == 200
    usage = first.json()["usage"]
    counter = data_plane().budgets
    assert counter is not None

    async def charged() -> bool:  # the turn runner reports a moment after the answer's last byte
        return counter.used(tenant) == usage["prompt_tokens"] + usage["completion_tokens"]

    await until(charged)
    second = await gateway.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers)
    assert second.status_code == 429 and second.headers["x-gw-error-code"] == "budget_exceeded"

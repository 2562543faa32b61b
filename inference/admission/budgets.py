"""Token budgets per tenant (issue 25 item 5): tokens (prompt plus completion) one tenant's keys may
use per UTC day or calendar month (UTC). A tenant whose budget is used up is refused at admission
with 429 ``budget_exceeded`` and a Retry-After to the period's end; a request already running always
finishes, since tokens are known only at a request's end and are charged then
(:meth:`inference.dataplane.DataPlane.account`). The shared key's and open mode's use
(:data:`inference.accounting.SHARED_SCOPE`, ``OPEN_SCOPE``) is never budgeted.

The request path does no I/O here. :meth:`BudgetCounter.check` reads this process's view of each
tenant's use in its current period (a dict lookup); :meth:`BudgetCounter.charge` adds a finished
request's tokens to that view and to a batch to send. A request is charged to the period it arrived
in, as the usage tables count it.

With ``REDIS_URL`` set (:class:`RedisBudgetCounter`) the period's use lives in one Redis counter per
tenant and period, shared by every gateway process and host: a task off the request path sends this
process's batched charges (INCRBY, in one Lua script per batch, made idempotent by a batch id so a
batch sent again after a lost answer is counted once) and reads back the counters of the tenants
this process served, every :data:`SYNC_SECS` (0.5 s) while it serves them, and every
:data:`NEAR_SYNC_SECS` (20 ms) while one of them is near its budget in this process's view (90 %
used or more: a charge, or a check of a tenant not refused yet, that finds it so ends the long
pause at once; a refused tenant's count only grows, so its checks leave the pace alone). A
process also sends a tenant's charges at once when those it holds reach :data:`SEND_SHARE` (10 %)
of the tenant's budget. One round trip per sync, however many requests; the answer to a send is the
tenant's total, so a process's view is the total as of its last sync plus its own use since.

The counters are exact: every charge of every process is added exactly once. The refusal follows
them within a bound. A process sees its own charges at once and the others' at its next sync; what
it admits on a stale view is bounded in tokens, since its own charges reaching 10 % of the budget
make it sync (sending them and reading the total): so across N processes a tenant's use passes its
budget by at most about N x 10 % of it, plus what each admits within one short pause and the
requests in flight when its view caught up; and in time, a process syncing every :data:`NEAR_SYNC_SECS` once its view shows 90 % of the budget and
every :data:`SYNC_SECS` before. Every request admitted before the budget ran out finishes and is
charged (tokens are known only at the end).

While Redis cannot be reached each process goes on counting: the last counts it read plus its own
charges since (held, and sent once Redis answers again), the outage logged once
(:data:`common.outages.REDIS`), nothing refused because Redis is down. A Redis that restarts without
persistence forgets the period's counts.

Without Redis (:class:`LocalBudgetCounter`) each process counts only its own use, so N serving
processes (or hosts) may together let a tenant use up to N times its budget in a period, and a
restarted process starts the period from zero.

Where a tenant's budget comes from (:meth:`TenantBudgets.combine`, the one place that decides): a
row stored in the admin console (table ``administration_tenantbudget``), else its
``--tenant-budget`` flag, else ``--default-tenant-budget``; 0 tokens means unlimited, so a stored 0
exempts a tenant from the default. The fleet loop reads the rows (on notices and every 5 s, never
per request) and installs the result with :meth:`inference.dataplane.DataPlane.install_tenant_budgets`.
"""

from __future__ import annotations

import asyncio
import calendar
import logging
import math
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from common.config import BUDGET_PERIODS
from common.outages import REDIS
from inference.admission.rate_limit import shared_counter_client

__all__ = [
    "Budget",
    "BudgetRefusal",
    "TenantBudgets",
    "BudgetCounter",
    "LocalBudgetCounter",
    "RedisBudgetCounter",
    "current_period",
    "refit_budget_counter",
    "SYNC_SECS",
    "NEAR_SYNC_SECS",
]

log = logging.getLogger(__name__)

SYNC_SECS = 0.5  # how often a serving process sends its charges and reads the shared counts (Redis)
NEAR_SHARE = 0.9  # a tenant whose view shows this share of its budget used is near it: sync faster
NEAR_SYNC_SECS = 0.02  # how often, then
SEND_SHARE = 0.1  # charges of a tenant held in one process reaching this share of its budget are sent at once
KEY_GRACE_SECS = 86_400  # a period's Redis counter outlives the period by this long
BATCH_MARKER_SECS = 3_600  # a sent batch's id is remembered this long (a batch resent later is refused)

# KEYS[1]: the batch's marker; KEYS[2..n+1]: counters to add to; KEYS[n+2..]: counters only read.
# ARGV[1]: the marker's TTL (s), ARGV[2]: n, then per counter added to its tokens and expiry (Unix s).
# A batch whose marker exists was counted already (its answer was lost): it only reads.
_CHARGE_SCRIPT = """
local n = tonumber(ARGV[2])
local fresh = n == 0 or redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1])
local counts = {}
for i = 2, #KEYS do
  local count
  if fresh and i <= n + 1 then
    count = redis.call('INCRBY', KEYS[i], ARGV[2 * i - 1])
    redis.call('EXPIREAT', KEYS[i], ARGV[2 * i])
  else
    count = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  counts[#counts + 1] = count
end
return counts
"""


@dataclass(frozen=True, slots=True)
class Budget:
    """Tokens per period (``day`` or ``month``); 0 tokens: unlimited."""

    tokens: int
    period: str

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``TOKENS/day`` or ``TOKENS/month`` (the flags' form, checked by common.config)."""
        tokens, _, period = text.partition("/")
        if period not in BUDGET_PERIODS:
            raise ValueError(f"not a token budget: {text!r}")
        return cls(int(tokens), period)

    def __str__(self) -> str:
        return f"{self.tokens}/{self.period}"


def current_period(period: str, at: float) -> tuple[str, float]:
    """The ``period`` (day or month) holding Unix time ``at``: its name ("day:2026-11-28",
    "month:2026-11") and when it ends (Unix seconds, UTC)."""
    name, _, ends = _bounds(period, at)
    return name, ends


def _bounds(period: str, at: float) -> tuple[str, float, float]:
    moment = datetime.fromtimestamp(at, timezone.utc)
    if period == "day":
        start = calendar.timegm((moment.year, moment.month, moment.day, 0, 0, 0))
        return f"day:{moment:%Y-%m-%d}", float(start), float(start + 86_400)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    start = calendar.timegm((moment.year, moment.month, 1, 0, 0, 0))
    return f"month:{moment:%Y-%m}", float(start), float(calendar.timegm((year, month, 1, 0, 0, 0)))


class _Periods:
    """The current day and month for a clock, recomputed only when one ends (a float compare per
    request instead of a date conversion)."""

    __slots__ = ("_clock", "_found")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._found: dict[str, tuple[str, float, float]] = {}  # period -> the newest seen: name, start, end

    def now(self, period: str) -> tuple[str, float, float]:
        """The current period's name and end, and the time."""
        now = self._clock()
        found = self._found.get(period)
        if found is None or not found[1] <= now < found[2]:
            found = self.of(period, now)
        return found[0], found[2], now

    def of(self, period: str, at: float) -> tuple[str, float, float]:
        """The name, start and end of the ``period`` holding ``at``."""
        found = self._found.get(period)
        if found is not None and found[1] <= at < found[2]:
            return found
        fresh = _bounds(period, at)
        if found is None or fresh[2] > found[2]:
            self._found[period] = fresh
        return fresh


def _same_kind_older(held: str, period: str) -> bool:
    """Whether period name ``held`` is of the same kind as ``period`` (day, month) and later: then
    ``period`` ended before it."""
    return held.partition(":")[0] == period.partition(":")[0] and held > period


class TenantBudgets:
    """Each tenant's budget: its own, else the default. Scopes (the shared key, open mode) have none."""

    __slots__ = ("default", "by_tenant")

    def __init__(self, default: Budget, by_tenant: Iterable[tuple[str, Budget]]) -> None:
        self.default = default
        self.by_tenant = dict(by_tenant)

    @classmethod
    def combine(cls, default: str, flags: Iterable[tuple[str, str]], stored: Mapping[str, str]) -> TenantBudgets:
        """The budgets in force: per tenant a stored row (``TOKENS/period``) overrides its
        --tenant-budget flag, and --default-tenant-budget covers tenants with neither (0: unlimited)."""
        by_tenant = dict(flags)
        by_tenant.update(stored)
        return cls(Budget.parse(default), ((tenant, Budget.parse(text)) for tenant, text in by_tenant.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TenantBudgets):
            return NotImplemented
        return self.default == other.default and self.by_tenant == other.by_tenant

    __hash__ = None  # type: ignore[assignment]  # mutable dict inside: equal by value, not hashable

    def __repr__(self) -> str:
        return f"TenantBudgets(default={self.default}, by_tenant={ {t: str(b) for t, b in self.by_tenant.items()} })"

    @property
    def any(self) -> bool:
        return self.default.tokens > 0 or any(budget.tokens > 0 for budget in self.by_tenant.values())

    def budget_for(self, tenant: str) -> Budget | None:
        """The tenant's budget, None when it has none (unlimited, or a scope: the shared key, open mode)."""
        budget = self.by_tenant.get(tenant, self.default)
        if budget.tokens <= 0 or tenant.startswith(":"):  # SHARED_SCOPE, OPEN_SCOPE: never a tenant id
            return None
        return budget


@dataclass(frozen=True, slots=True)
class BudgetRefusal:
    """A tenant refused because its budget of the current period is used up."""

    tenant: str
    budget: Budget
    used: int
    resets_at: float  # Unix seconds: the period's end
    now: float

    @property
    def retry_after(self) -> int:
        """Whole seconds to the period's end (at least 1)."""
        return max(1, math.ceil(self.resets_at - self.now))


class BudgetCounter:
    """What each budgeted tenant used in its current period as this process knows it. ``check`` and
    ``charge`` are the request path's: no I/O, no await."""

    def __init__(self, budgets: TenantBudgets, clock: Callable[[], float] = time.time) -> None:
        self.budgets = budgets
        self._periods = _Periods(clock)

    def check(self, tenant: str) -> BudgetRefusal | None:
        """None when ``tenant`` may start a request (no budget, or tokens left this period)."""
        budget = self.budgets.budget_for(tenant)
        if budget is None:
            return None
        name, ends, now = self._periods.now(budget.period)
        used = self._used(tenant, name)
        if used < budget.tokens:
            return None
        return BudgetRefusal(tenant, budget, used, ends, now)

    def used(self, tenant: str) -> int | None:
        """The tenant's tokens in its current period as this process knows them (None: no budget)."""
        budget = self.budgets.budget_for(tenant)
        if budget is None:
            return None
        return self._used(tenant, self._periods.now(budget.period)[0])

    def charge(self, tenant: str, tokens: int, at: float) -> None:
        """Add a finished request's tokens to the period it arrived in (``at``, Unix seconds)."""
        if tokens <= 0:
            return
        budget = self.budgets.budget_for(tenant)
        if budget is None:
            return
        name, _, ends = self._periods.of(budget.period, at)
        self._add(tenant, name, ends, tokens)

    def _used(self, tenant: str, period: str) -> int:
        raise NotImplementedError

    def _add(self, tenant: str, period: str, ends: float, tokens: int) -> None:
        raise NotImplementedError

    async def sync(self) -> None:
        """Send the charges held and read the shared counts (Redis); nothing without Redis."""

    async def aclose(self) -> None:
        """Send what is held, and release connections (lifespan shutdown)."""


class _PeriodCounts:
    """Tokens per tenant in one period each (an older period's count is dropped when a newer comes)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, tuple[str, int]] = {}  # tenant -> (period name, tokens)

    def get(self, tenant: str, period: str) -> int:
        found = self._counts.get(tenant)
        return found[1] if found is not None and found[0] == period else 0

    def add(self, tenant: str, period: str, tokens: int) -> None:
        found = self._counts.get(tenant)
        if found is None or found[0] != period:
            if found is not None and _same_kind_older(found[0], period):  # a late charge of a period over
                return
            found = (period, 0)
        self._counts[tenant] = (period, found[1] + tokens)

    def set(self, tenant: str, period: str, tokens: int) -> None:
        found = self._counts.get(tenant)
        if found is None or not _same_kind_older(found[0], period):
            self._counts[tenant] = (period, tokens)


class LocalBudgetCounter(BudgetCounter):
    """Counted in this process alone (no Redis): see the module's bound."""

    def __init__(self, budgets: TenantBudgets, clock: Callable[[], float] = time.time) -> None:
        super().__init__(budgets, clock)
        self._counts = _PeriodCounts()

    def _used(self, tenant: str, period: str) -> int:
        return self._counts.get(tenant, period)

    def _add(self, tenant: str, period: str, ends: float, tokens: int) -> None:
        self._counts.add(tenant, period, tokens)


_Key = tuple[str, str]  # tenant, period name


@dataclass(slots=True)
class _Batch:
    """Charges sent (or to send again) as one: its id makes a resend count once."""

    id: str
    tokens: dict[_Key, int]
    ends: dict[_Key, float]


class RedisBudgetCounter(BudgetCounter):
    """The counts shared through Redis: key ``<prefix><tenant>:<period name>`` per tenant and period.

    A tenant's use here is the count last read from Redis plus this process's charges not yet in
    it (held, or on their way). A sync task runs on each event loop that checks or charges: a sync
    at once, then one every ``sync_secs`` while tenants are checked or charges wait; it ends after a
    pause in which nothing happened, and the next request starts it again.
    """

    def __init__(
        self, budgets: TenantBudgets, url: str, prefix: str = "gw:budget:", *,
        clock: Callable[[], float] = time.time, sync_secs: float = SYNC_SECS, near_sync_secs: float = NEAR_SYNC_SECS,
        run_syncs: bool = True,
    ) -> None:
        super().__init__(budgets, clock)
        self.url = url
        self.prefix = prefix
        self.sync_secs = sync_secs
        self.near_sync_secs = near_sync_secs
        self._near = False  # a tenant near its budget was checked or charged since the last sync
        self._pauses: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}  # a sync task's long pause
        self._run_syncs = run_syncs  # tests drive sync() themselves
        self._shared = _PeriodCounts()  # the counts last read from Redis
        self._held: dict[_Key, int] = {}  # charged here, not sent yet
        self._ends: dict[_Key, float] = {}
        self._sending: _Batch | None = None  # sent, answer awaited (or lost: to send again)
        self._served: set[_Key] = set()  # tenants checked or charged since the last sync
        self._clients: dict[asyncio.AbstractEventLoop, tuple[Any, Any]] = {}
        self._syncers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()

    def check(self, tenant: str) -> BudgetRefusal | None:
        budget = self.budgets.budget_for(tenant)
        if budget is None:
            return None
        name, ends, now = self._periods.now(budget.period)
        key = (tenant, name)
        if key not in self._served:
            self._served.add(key)
            self._ends[key] = ends
            self._wake()
        used = self._used(tenant, name)
        if used < budget.tokens:
            if used >= budget.tokens * NEAR_SHARE:
                self._hurry()
            return None
        return BudgetRefusal(tenant, budget, used, ends, now)  # counts only grow: no hurry past the budget

    def charge(self, tenant: str, tokens: int, at: float) -> None:
        if tokens <= 0:
            return
        budget = self.budgets.budget_for(tenant)
        if budget is None:
            return
        name, _, ends = self._periods.of(budget.period, at)
        self._add(tenant, name, ends, tokens)
        held = self._held.get((tenant, name), 0)
        if held >= budget.tokens * SEND_SHARE or self._used(tenant, name) >= budget.tokens * NEAR_SHARE:
            self._hurry()  # a tenth of the budget unsent, or near it (past it too): the others should know

    def _used(self, tenant: str, period: str) -> int:
        key = (tenant, period)
        used = self._shared.get(tenant, period) + self._held.get(key, 0)
        sending = self._sending
        if sending is not None:
            used += sending.tokens.get(key, 0)
        return used

    def _add(self, tenant: str, period: str, ends: float, tokens: int) -> None:
        key = (tenant, period)
        self._held[key] = self._held.get(key, 0) + tokens
        self._ends[key] = ends
        self._served.add(key)
        self._wake()

    def _wake(self) -> None:
        """Make sure a sync task runs on this event loop (none outside one: the next request's)."""
        if not self._run_syncs:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = self._syncers.get(loop)
        if task is None or task.done():
            self._syncers[loop] = loop.create_task(self._syncing())

    def _hurry(self) -> None:
        """A tenant is near its budget: the next sync now, and the following ones sooner."""
        if self._near:
            return
        self._near = True
        try:
            pause = self._pauses.get(asyncio.get_running_loop())
        except RuntimeError:
            return
        if pause is not None and not pause.done():
            pause.set_result(None)

    async def _syncing(self) -> None:
        # Ends once a pause found nothing to send or read (no await between that look and the end,
        # so a request after it sees the task done and starts another).
        loop = asyncio.get_running_loop()
        while self._served or self._held or self._sending is not None:
            near, self._near = self._near, False
            try:
                await self.sync()
            except Exception:  # never let the task die on a surprise: log and go on
                log.exception("token budget sync failed")
            if near or self._near:  # short pauses while a tenant is near its budget; nothing cuts them shorter
                await asyncio.sleep(self.near_sync_secs)
                continue
            pause = self._pauses[loop] = loop.create_future()
            timer = loop.call_later(self.sync_secs, _resolve, pause)
            try:
                await pause  # a tenant coming near its budget ends it early (_hurry)
            finally:
                timer.cancel()
                self._pauses.pop(loop, None)

    async def sync(self) -> None:
        async with self._lock:
            if not REDIS.retry_due():
                return
            if self._sending is None and self._held:
                self._sending = _Batch(uuid.uuid4().hex, self._held, {key: self._ends[key] for key in self._held})
                self._held = {}
            batch = self._sending
            charged = list(batch.tokens) if batch is not None else []
            read = [key for key in self._served if batch is None or key not in batch.tokens]
            self._served = set()
            if not charged and not read:
                return
            keys = [f"{self.prefix}{tenant}:{period}" for tenant, period in (*charged, *read)]
            args: list[Any] = [BATCH_MARKER_SECS, len(charged)]
            for key in charged:
                assert batch is not None
                args += [batch.tokens[key], int(batch.ends[key]) + KEY_GRACE_SECS]
            marker = f"{self.prefix}batch:{batch.id}" if batch is not None else f"{self.prefix}batch:-"
            try:
                counts = await self._script()(keys=[marker, *keys], args=args)
            except Exception as exc:  # redis.RedisError, OSError, timeouts: hold the batch, count here
                REDIS.failed(exc)
                self._served.update(read)
                return
            REDIS.recovered()
            self._sending = None
            for (tenant, period), count in zip((*charged, *read), counts):
                self._shared.set(tenant, period, int(count))
            self._drop_ended()

    def _drop_ended(self) -> None:
        """Forget the period ends of keys no longer held or served."""
        if len(self._ends) > 2 * (len(self._held) + len(self._served)) + 64:
            live = set(self._held) | self._served
            self._ends = {key: ends for key, ends in self._ends.items() if key in live}

    def _script(self) -> Any:
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None:
            client = shared_counter_client(self.url)
            found = self._clients[loop] = (client, client.register_script(_CHARGE_SCRIPT))
        return found[1]

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        task = self._syncers.pop(loop, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._held or self._sending is not None:
            await self.sync()  # the charges held go to Redis before the process ends
        found = self._clients.pop(loop, None)
        if found is not None:
            await found[0].aclose()


def _resolve(pause: asyncio.Future[None]) -> None:
    if not pause.done():
        pause.set_result(None)


def refit_budget_counter(
    current: BudgetCounter | None, budgets: TenantBudgets, redis_url: str | None
) -> BudgetCounter:
    """The counter that enforces ``budgets``: ``current`` with its budgets swapped in place (its
    counts and Redis connections carry on), or a new one when there is none yet."""
    if current is None:
        return RedisBudgetCounter(budgets, redis_url) if redis_url else LocalBudgetCounter(budgets)
    current.budgets = budgets
    return current

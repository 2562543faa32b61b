"""Reading what was used (issue 25, items 4 and 6): usage and spend by tenant, model and day, the
request log, model prices and budgets' standing. The domain side of GET /usage, GET /usage/requests,
/prices and the console's usage page; nothing here knows HTTP or the console.

Spend (D71). A minute's spend is its tokens at the price in force at that minute, the price row of the
model with the latest ``effective_from`` at or before the minute::

    spend = ((prompt - cached) * input + cached * cached_input + completion * output) / 1,000,000

(cached tokens are part of the prompt, billed at the cached-input price instead of the input price; a
row whose cached count exceeds its prompt count bills no uncached prompt token). A model with no price
in force at a minute has spend 0 for it, and the answer names such models (``unpriced_models``) so an
operator sees a zero is a missing price, not free use. A price change adds a row: the old row keeps
pricing the minutes before the new one's ``effective_from``, so spend already shown never changes.

Aggregation runs in SQL, bounded by a date range (``--usage-max-range-days``): the price rows become
periods ``[effective_from, next effective_from)`` with a window function, usage minutes join their
period, tokens are summed per group and period, and each period's sums are multiplied by its price
once. Portable across Postgres and SQLite (the embedded store).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone as dt_timezone
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Any, Iterable, Mapping, NotRequired, Sequence, TypedDict

from django.db import connection, transaction
from django.db.models import Max, QuerySet, Sum
from django.utils import timezone

from administration.models import BudgetPeriod, ModelPrice, RequestLogEntry, UsageMinute
from administration.tenant_budgets import stored_tenant_budgets
from inference.admission.budgets import Budget, TenantBudgets

__all__ = [
    "GROUP_KEYS", "DEFAULT_RANGE_DAYS", "PAGE_SIZE_DEFAULT", "PAGE_SIZE_MAX", "PRICE_MAX", "CURSOR_PATTERN",
    "DATE_PATTERN", "GROUP_BY_PATTERN", "UsageQueryError", "PriceConflict", "UsageQuery", "UsageRow", "UsageAnswer",
    "parse_usage_query", "usage", "LogQuery", "LogRow", "LogPage", "parse_log_query", "request_log", "log_rows",
    "PriceRow", "price_row", "prices_in_force", "price_history", "parse_price", "add_price", "BudgetStanding",
    "budget_standings", "period_start", "tokens_used", "parse_datetime",
]  # fmt: skip

GROUP_KEYS = ("tenant", "model", "day")
DEFAULT_RANGE_DAYS = 30  # GET /usage without start: the 30 days ending at end (within the range limit)
PAGE_SIZE_DEFAULT = 100
PAGE_SIZE_MAX = 1000  # the most request log rows one page holds (a larger limit is refused)
_PRICE_FIELD = ModelPrice._meta.get_field("input_per_million")
PRICE_PLACES: int = _PRICE_FIELD.decimal_places
PRICE_MAX = Decimal(10) ** (_PRICE_FIELD.max_digits - PRICE_PLACES) - Decimal(1).scaleb(-PRICE_PLACES)
_QUANTUM = Decimal(1).scaleb(-PRICE_PLACES)
_MILLION = Decimal(1_000_000)
SPEND_PLACES = 6  # spend is answered rounded to this many decimal places
_BIGINT_MAX = 2**63 - 1

DATE_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
GROUP_BY_PATTERN = r"^((tenant|model|day)(,(tenant|model|day))*)?$"
CURSOR_PATTERN = r"^[0-9]{1,18}_[0-9]{1,19}$"
"""A request log page's cursor: the last row's arrival in Unix microseconds and its id. Any text of the
pattern is a valid cursor (the rows older than that point); the answer's next_cursor is one."""
_DATETIME = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
_UTC_MIN = datetime.min.replace(tzinfo=dt_timezone.utc)
_UTC_MAX = datetime.max.replace(tzinfo=dt_timezone.utc)


class UsageQueryError(ValueError):
    """A query or body the rules refuse (answered 400 bad_request)."""


class PriceConflict(Exception):
    """A price for this model from this very moment exists already (409 conflict)."""


def _utc(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=dt_timezone.utc)


def _date(raw: str, name: str) -> date:
    if not re.match(DATE_PATTERN, raw):
        raise UsageQueryError(f"'{name}' must be a date YYYY-MM-DD")
    try:
        return date(int(raw[:4]), int(raw[5:7]), int(raw[8:10]))
    except ValueError:
        raise UsageQueryError(f"'{name}' is not a calendar date: {raw!r}") from None


def parse_datetime(raw: str, name: str) -> datetime:
    """An RFC 3339 date-time as an aware UTC datetime (a leap second read as :59; a moment beyond what a
    datetime holds clamped to its range). Raises :class:`UsageQueryError`."""
    found = _DATETIME.match(raw)
    if found is None:
        raise UsageQueryError(f"'{name}' must be an RFC 3339 date-time, e.g. 2026-01-31T12:00:00Z")
    year, month, day, hour, minute, second = (int(found.group(index)) for index in range(1, 7))
    fraction, offset = found.group(7) or "", found.group(8)
    try:
        if offset in ("Z", "z"):
            zone = dt_timezone.utc
        else:
            hours, minutes = int(offset[1:3]), int(offset[4:6])
            if hours > 23 or minutes > 59:
                raise ValueError
            delta = timedelta(hours=hours, minutes=minutes)
            zone = dt_timezone(-delta if offset[0] == "-" else delta)
        if year == 0:
            return _UTC_MIN
        moment = datetime(year, month, day, hour, minute, min(second, 59), int((fraction + "000000")[:6]), tzinfo=zone)
    except ValueError:
        raise UsageQueryError(f"'{name}' is not a valid date-time: {raw!r}") from None
    try:
        return moment.astimezone(dt_timezone.utc)
    except OverflowError:
        return _UTC_MIN if moment.year == 1 else _UTC_MAX


def _text_filter(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if "\x00" in value:
        raise UsageQueryError(f"'{name}' must not contain NUL characters")
    return value


# --- usage and spend ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UsageQuery:
    start: date
    end: date  # inclusive
    group_by: tuple[str, ...] = ()
    tenant: str | None = None
    model: str | None = None


class UsageRow(TypedDict):
    tenant: NotRequired[str]
    model: NotRequired[str]
    day: NotRequired[str]
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    spend: float


class UsageAnswer(TypedDict):
    data: list[UsageRow]
    start: str
    end: str
    unpriced_models: list[str]


def parse_usage_query(params: Mapping[str, str], *, today: date, max_days: int) -> UsageQuery:
    """GET /usage's query: ``start``/``end`` (dates, inclusive; default the :data:`DEFAULT_RANGE_DAYS`
    days ending today, UTC), ``group_by`` (a comma-separated subset of tenant, model, day), ``tenant``,
    ``model``. A range longer than ``max_days`` days, or ending before it starts, is refused."""
    end = _date(params["end"], "end") if "end" in params else today
    if "start" in params:
        start = _date(params["start"], "start")
    else:
        back = max(min(DEFAULT_RANGE_DAYS, max_days) - 1, 0)
        start = end - timedelta(days=back) if (end - date.min).days >= back else date.min
    if start > end:
        raise UsageQueryError(f"'start' ({start}) is after 'end' ({end})")
    days = (end - start).days + 1
    if days > max_days:
        raise UsageQueryError(
            f"the range {start} to {end} is {days} days; at most {max_days} (--usage-max-range-days) per request"
        )
    raw_groups = params.get("group_by", "")
    if not re.match(GROUP_BY_PATTERN, raw_groups):
        raise UsageQueryError(f"'group_by' is a comma-separated list of {', '.join(GROUP_KEYS)}, got {raw_groups!r}")
    named = set(raw_groups.split(",")) if raw_groups else set()
    group_by = tuple(key for key in GROUP_KEYS if key in named)
    return UsageQuery(start, end, group_by, _text_filter(params, "tenant"), _text_filter(params, "model"))


def _day_sql() -> str:
    if connection.vendor == "postgresql":
        return "to_char(u.minute AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
    return "substr(u.minute, 1, 10)"  # SQLite keeps UTC text "YYYY-MM-DD HH:MM:SS"


def _usage_where(query: UsageQuery) -> tuple[str, list[Any]]:
    moment = connection.ops.adapt_datetimefield_value  # as the ORM writes it (SQLite: naive UTC text)
    clauses = ["u.minute >= %s"]
    values: list[Any] = [moment(_utc(query.start))]
    if query.end < date.max:
        clauses.append("u.minute < %s")
        values.append(moment(_utc(query.end + timedelta(days=1))))
    for column in ("tenant", "model"):
        value = getattr(query, column)
        if value is not None:
            clauses.append(f"u.{column} = %s")
            values.append(value)
    return " AND ".join(clauses), values


def _tables() -> dict[str, str]:
    quote = connection.ops.quote_name
    return {"usage": quote(UsageMinute._meta.db_table), "price": quote(ModelPrice._meta.db_table)}


_PERIODS = """
    SELECT id, model, effective_from,
           LEAD(effective_from) OVER (PARTITION BY model ORDER BY effective_from) AS effective_to
    FROM {price}
"""
_IN_PERIOD = "p.model = u.model AND u.minute >= p.effective_from AND (p.effective_to IS NULL OR u.minute < p.effective_to)"


def _number(value: Any) -> Decimal:
    if value is None:
        return Decimal(0)
    return value if isinstance(value, Decimal) else Decimal(str(value))


def usage(query: UsageQuery) -> UsageAnswer:
    """Usage and spend over ``query``'s days, one row per group (one row of totals, zeros included,
    when not grouped), ordered by day, tenant and model."""
    tables = _tables()
    where, values = _usage_where(query)
    expressions = {"tenant": "u.tenant", "model": "u.model", "day": _day_sql()}
    keys = [expressions[key] for key in query.group_by]
    selected = "".join(f"{expression} AS g{index}, " for index, expression in enumerate(keys))
    grouped = ", ".join([*keys, "p.id"])
    # Tokens summed per group and price period; the outer loop prices each period's sums once.
    sql = f"""
        WITH periods AS ({_PERIODS.format(**tables)})
        SELECT {selected}p.id,
               SUM(u.requests), SUM(u.errors), SUM(u.prompt_tokens), SUM(u.completion_tokens), SUM(u.cached_tokens),
               SUM(CASE WHEN u.prompt_tokens > u.cached_tokens THEN u.prompt_tokens - u.cached_tokens ELSE 0 END)
        FROM {tables['usage']} u LEFT JOIN periods p ON {_IN_PERIOD}
        WHERE {where}
        GROUP BY {grouped}
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        fetched = cursor.fetchall()
    prices = {row.pk: row for row in ModelPrice.objects.filter(pk__in={row[len(keys)] for row in fetched} - {None})}
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    any_unpriced = False
    for record in fetched:
        group = tuple(str(value) for value in record[: len(keys)])
        period, requests, errors, prompt, completion, cached, uncached = record[len(keys):]
        row = rows.setdefault(group, {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                      "cached_tokens": 0, "spend": Decimal(0)})  # fmt: skip
        row["requests"] += int(requests or 0)
        row["errors"] += int(errors or 0)
        row["prompt_tokens"] += int(prompt or 0)
        row["completion_tokens"] += int(completion or 0)
        row["cached_tokens"] += int(cached or 0)
        price = prices.get(period)
        if price is None:
            any_unpriced = any_unpriced or bool(int(prompt or 0) or int(completion or 0))
            continue  # which models: one more query, below
        row["spend"] += (
            _number(uncached) * price.input_per_million
            + _number(cached) * price.cached_input_per_million
            + _number(completion) * price.output_per_million
        ) / _MILLION
    if not keys and not rows:
        rows[()] = {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
                    "spend": Decimal(0)}  # fmt: skip
    data: list[UsageRow] = []
    order = [GROUP_KEYS.index(key) for key in ("day", "tenant", "model") if key in query.group_by]
    positions = {key: index for index, key in enumerate(query.group_by)}
    for group in sorted(rows, key=lambda g: tuple(g[positions[GROUP_KEYS[i]]] for i in order)):
        row = rows[group]
        answer: dict[str, Any] = {key: group[positions[key]] for key in query.group_by}
        answer.update(row, spend=float(round(row["spend"], SPEND_PLACES)))
        data.append(answer)  # type: ignore[arg-type]  # built with UsageRow's keys
    return {
        "data": data,
        "start": query.start.isoformat(),
        "end": query.end.isoformat(),
        "unpriced_models": _unpriced_models(query) if any_unpriced else [],
    }


def _unpriced_models(query: UsageQuery) -> list[str]:
    """The models with tokens in the range at a minute no price covers (their spend there is 0)."""
    tables = _tables()
    where, values = _usage_where(query)
    sql = f"""
        WITH periods AS ({_PERIODS.format(**tables)})
        SELECT DISTINCT u.model FROM {tables['usage']} u LEFT JOIN periods p ON {_IN_PERIOD}
        WHERE {where} AND p.id IS NULL AND (u.prompt_tokens > 0 OR u.completion_tokens > 0)
        ORDER BY u.model
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        return [str(row[0]) for row in cursor.fetchall()]


# --- the request log ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogQuery:
    start: datetime | None = None
    end: datetime | None = None  # exclusive
    tenant: str | None = None
    model: str | None = None
    status: int | None = None
    request_id: str | None = None
    limit: int = PAGE_SIZE_DEFAULT
    cursor: tuple[datetime, int] | None = None


class LogRow(TypedDict):
    at: str
    request_id: str
    tenant: str
    model: str
    worker: str
    surface: str
    route: str
    status: int
    outcome: str
    error_code: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    tokens_estimated: bool
    latency_ms: float
    ttft_ms: float | None


class LogPage(TypedDict):
    data: list[LogRow]
    has_more: bool
    next_cursor: str | None


def _cursor(raw: str) -> tuple[datetime, int]:
    if not re.match(CURSOR_PATTERN, raw):
        raise UsageQueryError("'cursor' is not a cursor this route gave (next_cursor)")
    micros, _, row_id = raw.partition("_")
    try:
        at = datetime.fromtimestamp(int(micros) / 1_000_000, tz=dt_timezone.utc)
        at = at.replace(microsecond=int(micros) % 1_000_000)
    except (OverflowError, ValueError, OSError):
        at = _UTC_MAX
    return at, min(int(row_id), _BIGINT_MAX)


def _encode_cursor(at: datetime, row_id: int) -> str:
    delta = at - datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
    return f"{(delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds}_{row_id}"


def parse_log_query(params: Mapping[str, str]) -> LogQuery:
    """GET /usage/requests's query: ``start``/``end`` (RFC 3339 date-times, end exclusive), ``tenant``,
    ``model``, ``status`` (an HTTP status), ``request_id``, ``limit`` (1 to :data:`PAGE_SIZE_MAX`) and
    ``cursor`` (the previous page's next_cursor)."""
    start = parse_datetime(params["start"], "start") if "start" in params else None
    end = parse_datetime(params["end"], "end") if "end" in params else None
    status = None
    if "status" in params:
        raw = params["status"]
        if not re.match(r"^[0-9]{3}$", raw) or not 100 <= int(raw) <= 599:
            raise UsageQueryError(f"'status' is an HTTP status 100 to 599, got {raw!r}")
        status = int(raw)
    limit = PAGE_SIZE_DEFAULT
    if "limit" in params:
        raw = params["limit"]
        if not re.match(r"^[0-9]{1,9}$", raw) or not 1 <= int(raw) <= PAGE_SIZE_MAX:
            raise UsageQueryError(f"'limit' is a page size 1 to {PAGE_SIZE_MAX}, got {raw!r}")
        limit = int(raw)
    return LogQuery(
        start=start, end=end, tenant=_text_filter(params, "tenant"), model=_text_filter(params, "model"),
        status=status, request_id=_text_filter(params, "request_id"), limit=limit,
        cursor=_cursor(params["cursor"]) if "cursor" in params else None,
    )  # fmt: skip


def log_rows(query: LogQuery) -> QuerySet[RequestLogEntry]:
    """The filtered request log, newest first (no page applied)."""
    rows = RequestLogEntry.objects.all()
    if query.start is not None:
        rows = rows.filter(at__gte=query.start)
    if query.end is not None:
        rows = rows.filter(at__lt=query.end)
    for name in ("tenant", "model", "status", "request_id"):
        value = getattr(query, name)
        if value is not None:
            rows = rows.filter(**{name: value})
    return rows.order_by("-at", "-id")


def _log_row(row: RequestLogEntry) -> LogRow:
    return {
        "at": row.at.astimezone(dt_timezone.utc).isoformat().replace("+00:00", "Z"), "request_id": row.request_id,
        "tenant": row.tenant, "model": row.model, "worker": row.worker, "surface": row.surface, "route": row.route,
        "status": row.status, "outcome": row.outcome, "error_code": row.error_code,
        "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
        "cached_tokens": row.cached_tokens, "reasoning_tokens": row.reasoning_tokens,
        "tokens_estimated": row.tokens_estimated, "latency_ms": row.latency_ms, "ttft_ms": row.ttft_ms,
    }  # fmt: skip


def request_log(query: LogQuery) -> LogPage:
    """One page of the request log (keyset pagination on arrival time and id: pages stay stable while
    the flush loop adds rows)."""
    rows = log_rows(query)
    if query.cursor is not None:
        at, row_id = query.cursor
        rows = rows.filter(at__lte=at).exclude(at=at, id__gte=row_id)
    page = list(rows[: query.limit + 1])
    more = len(page) > query.limit
    page = page[: query.limit]
    return {
        "data": [_log_row(row) for row in page],
        "has_more": more,
        "next_cursor": _encode_cursor(page[-1].at, page[-1].pk) if more else None,
    }


# --- prices ------------------------------------------------------------------------------------------


class PriceRow(TypedDict):
    model: str
    effective_from: str
    input_per_million: float
    cached_input_per_million: float
    output_per_million: float
    in_force: bool


def price_row(row: ModelPrice, in_force: bool) -> PriceRow:
    return {
        "model": row.model,
        "effective_from": row.effective_from.astimezone(dt_timezone.utc).isoformat().replace("+00:00", "Z"),
        "input_per_million": float(row.input_per_million),
        "cached_input_per_million": float(row.cached_input_per_million),
        "output_per_million": float(row.output_per_million),
        "in_force": in_force,
    }


def prices_in_force(now: datetime | None = None) -> list[PriceRow]:
    """Each model's price in force now, and any price scheduled after it (in_force false), by model."""
    moment = now or timezone.now()
    current = dict(
        ModelPrice.objects.filter(effective_from__lte=moment).values("model").annotate(latest=Max("effective_from"))
        .values_list("model", "latest")
    )  # fmt: skip
    rows: list[PriceRow] = []
    for row in ModelPrice.objects.order_by("model", "effective_from"):
        if row.effective_from > moment:
            rows.append(price_row(row, False))
        elif current.get(row.model) == row.effective_from:
            rows.append(price_row(row, True))
    return rows


def price_history(model: str, now: datetime | None = None) -> list[PriceRow]:
    """Every price of one model, newest first (the one in force marked)."""
    moment = now or timezone.now()
    rows = list(ModelPrice.objects.filter(model=model).order_by("-effective_from"))
    in_force = next((row.pk for row in rows if row.effective_from <= moment), None)
    return [price_row(row, row.pk == in_force) for row in rows]


def _price_value(value: Any, name: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise UsageQueryError(f"'{name}' must be a number")
    try:
        number = value if isinstance(value, Decimal) else Decimal(str(value))
    except InvalidOperation:
        raise UsageQueryError(f"'{name}' must be a number") from None
    if not number.is_finite() or number < 0 or number > PRICE_MAX:
        raise UsageQueryError(f"'{name}' must be a number from 0 to {PRICE_MAX}")
    return number.quantize(_QUANTUM, rounding=ROUND_DOWN)


def parse_price(body: Any, now: datetime) -> ModelPrice:
    """A new price from a POST /prices body (not saved): ``model``, the three per-million prices and an
    optional ``effective_from`` (default now), which may not lie in the past: a price change never
    rewrites the spend of tokens already used."""
    if not isinstance(body, dict):
        raise UsageQueryError("The body must be a JSON object")
    model = body.get("model")
    limit = ModelPrice._meta.get_field("model").max_length or 255
    if not isinstance(model, str) or not model.strip() or "\x00" in model or len(model) > limit:
        raise UsageQueryError(f"'model' must be a non-empty string of at most {limit} characters, without NUL")
    for name in ("input_per_million", "output_per_million"):
        if name not in body:
            raise UsageQueryError(f"'{name}' is required")
    input_price = _price_value(body["input_per_million"], "input_per_million")
    # Not given: cached input tokens cost what input tokens cost.
    cached_price = _price_value(body.get("cached_input_per_million", input_price), "cached_input_per_million")
    effective = body.get("effective_from")
    if effective is None:
        moment = now
    elif isinstance(effective, str):
        moment = parse_datetime(effective, "effective_from")
        if moment < now:
            raise UsageQueryError("'effective_from' is in the past: a price change never rewrites spent history")
    else:
        raise UsageQueryError("'effective_from' must be an RFC 3339 date-time")
    return ModelPrice(
        model=model, effective_from=moment, input_per_million=input_price, cached_input_per_million=cached_price,
        output_per_million=_price_value(body["output_per_million"], "output_per_million"),
    )  # fmt: skip


def add_price(row: ModelPrice) -> ModelPrice:
    """Store a new price row (never an update). Raises :class:`PriceConflict` for a taken moment."""
    with transaction.atomic():
        if ModelPrice.objects.filter(model=row.model, effective_from=row.effective_from).exists():
            raise PriceConflict(f"'{row.model}' already has a price from {row.effective_from.isoformat()}")
        row.pk = None
        row.save(force_insert=True)
    return row


# --- budgets -----------------------------------------------------------------------------------------


def period_start(period: str, now: datetime) -> datetime:
    """The start of the UTC day or calendar month holding ``now``."""
    moment = now.astimezone(dt_timezone.utc)
    if period == BudgetPeriod.MONTH:
        return datetime(moment.year, moment.month, 1, tzinfo=dt_timezone.utc)
    return datetime(moment.year, moment.month, moment.day, tzinfo=dt_timezone.utc)


def period_end(period: str, now: datetime) -> datetime:
    start = period_start(period, now)
    if period == BudgetPeriod.MONTH:
        return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=dt_timezone.utc)
    return start + timedelta(days=1)


def tokens_used(tenants: Iterable[str], since: datetime) -> dict[str, int]:
    """Prompt plus completion tokens per tenant since ``since`` (flushed usage minutes)."""
    sums = (
        UsageMinute.objects.filter(tenant__in=list(tenants), minute__gte=since).values("tenant")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )  # fmt: skip
    return {row["tenant"]: int(row["prompt"] or 0) + int(row["completion"] or 0) for row in sums}


@dataclass(frozen=True, slots=True)
class BudgetStanding:
    """One tenant's budget in its current period: where it comes from, used and left."""

    tenant: str
    tokens: int  # 0: unlimited
    period: str
    source: str  # "console" (a TenantBudget row), "flag" (--tenant-budget) or "default" (--default-tenant-budget)
    used: int
    period_start: datetime
    period_end: datetime

    @property
    def left(self) -> int | None:
        return None if not self.tokens else max(self.tokens - self.used, 0)

    @property
    def used_percent(self) -> float | None:
        return None if not self.tokens else round(100.0 * self.used / self.tokens, 1)


def budget_standings(
    default: str, flags: Sequence[tuple[str, str]], now: datetime | None = None
) -> list[BudgetStanding]:
    """Every tenant with a budget of its own (console rows win over --tenant-budget flags, as
    :meth:`TenantBudgets.combine` decides), and every tenant that used tokens this period under
    ``default`` (--default-tenant-budget), with the tokens used in its current period so far (the
    flushed usage minutes: up to one flush interval behind the gate's own count)."""
    moment = now or timezone.now()
    stored = stored_tenant_budgets()  # the fleet loop's one read: a row with a bad period left out
    budgets = TenantBudgets.combine(default, flags, stored)
    sources = {tenant: "console" if tenant in stored else "flag" for tenant in budgets.by_tenant}
    chosen: dict[str, Budget] = dict(budgets.by_tenant)
    if budgets.default.tokens > 0:
        since = period_start(budgets.default.period, moment)
        users = UsageMinute.objects.filter(minute__gte=since).exclude(tenant__startswith=":")
        for tenant in users.values_list("tenant", flat=True).distinct():
            if tenant not in chosen:
                chosen[tenant] = budgets.default
                sources[tenant] = "default"
    standings: list[BudgetStanding] = []
    for period in (BudgetPeriod.DAY, BudgetPeriod.MONTH):
        tenants = [tenant for tenant, budget in chosen.items() if budget.period == period]
        if not tenants:
            continue
        used = tokens_used(tenants, period_start(period, moment))
        for tenant in tenants:
            standings.append(BudgetStanding(tenant, chosen[tenant].tokens, str(period), sources[tenant],
                                            used.get(tenant, 0), period_start(period, moment), period_end(period, moment)))
    return sorted(standings, key=lambda standing: standing.tenant)

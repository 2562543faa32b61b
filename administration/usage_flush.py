"""Usage accounting's write side: each serving process's ledger (inference.accounting) written to the
store off the request path, and the request log kept to its size and age (docs/DECISIONS.md D67).

Every ``--usage-flush-interval-secs`` the flusher drains the data plane's ledger on the event loop (a
swap of containers) and writes the batch on a worker thread in ONE transaction (the minute sums folded
from the batch's entries first, in the loop that makes the log's rows: D116): one bulk upsert
of the (minute, tenant, model) sums that ADDS to the stored rows (``INSERT ... ON CONFLICT (minute,
tenant, model) DO UPDATE SET requests = <table>.requests + excluded.requests, ...``, the same text on
Postgres and SQLite), so every process of every host on one store sums into the same rows, and one
INSERT of the request log's rows executed for each row (not the ORM's bulk_create: D82; on Postgres
one COPY: D85, amended). The upsert's rows go in one order (minute, tenant, model) in every process,
so two flushes touching the same rows wait for each other instead of deadlocking.

A flush the store refuses (an outage: :data:`common.db.STORE_ERRORS`, logged once as one by
:data:`common.outages.STORE`) puts its batch back into the ledger, bounded (the oldest minutes and log
rows go first past :data:`MAX_HELD_MINUTES` and the ledger's log capacity), and the next interval
carries it. Any other error is a bug: logged, and that batch dropped (the same rows would fail again).

On a graceful shutdown the lifecycle stops the flusher after the requests in flight and the
background runs finished: its last flush writes what they used before the process exits. A crash
loses what was added since the last successful flush: at most one interval (plus whatever a store
outage was holding back).

The process leading its host (administration/host.py; every process of a one-process gateway) prunes
the request log every :data:`PRUNE_EVERY_SECS`: rows older than ``--request-log-retention-days``, then
all but the newest ``--request-log-max-rows``, in batches of :data:`PRUNE_BATCH_ROWS` rows, each its
own short transaction, at most :data:`PRUNE_MAX_BATCHES` batches a round.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from math import floor
from struct import Struct
from typing import Any, Callable

from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import CharField, QuerySet
from django.utils import timezone

from common.db import STORE_ERRORS, arun_db
from administration.models import RequestLogEntry, UsageMinute
from common.config import GatewayConfig
from common.ticks import next_mark
from inference.accounting import (
    MINUTE_FIELDS, AccountingEntry, Drained, EstimatedUsage, MinuteKey, Outcome, TokenUsage, UsageLedger, add_usages,
)
from inference.dataplane import DataPlane

__all__ = [
    "UsageFlusher", "write_usage", "prune_request_log", "delete_usage_before", "PurgeCounts", "fit_ledger",
    "MAX_HELD_MINUTES", "PRUNE_EVERY_SECS", "PRUNE_BATCH_ROWS", "PRUNE_MAX_BATCHES",
]  # fmt: skip

log = logging.getLogger(__name__)

# While the store is away, at most this many (tenant, model, minute) sums are held for it; past it the
# oldest minutes are dropped (and counted in the log line). 100,000 sums are a few tens of MiB.
MAX_HELD_MINUTES = 100_000
PRUNE_EVERY_SECS = 60.0
PRUNE_BATCH_ROWS = 5_000
PRUNE_MAX_BATCHES = 50  # a round deletes at most 250,000 rows; the next round carries on
UPSERT_MAX_ROWS = 500  # rows per upsert statement (fewer on SQLite, whose statements take 999 values)

_COLUMNS = ("minute", "tenant", "model", *MINUTE_FIELDS)


def _char_limits() -> dict[str, int]:
    return {
        f.name: f.max_length for f in RequestLogEntry._meta.get_fields()
        if isinstance(f, CharField) and f.max_length is not None
    }


_LOG_LIMITS = _char_limits()
_MINUTE_LIMITS = {f.name: f.max_length for f in UsageMinute._meta.get_fields() if isinstance(f, CharField)}


def _minute_of(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, UTC)


def _upsert_minutes(minutes: dict[MinuteKey, list[int]]) -> None:
    """One statement (or a few: :data:`UPSERT_MAX_ROWS` rows each) adding these sums to the stored
    rows, creating the missing ones."""
    quote = connection.ops.quote_name
    table = quote(UsageMinute._meta.db_table)
    names = ", ".join(quote(column) for column in _COLUMNS)
    adds = ", ".join(f"{quote(name)} = {table}.{quote(name)} + excluded.{quote(name)}" for name in MINUTE_FIELDS)
    conflict = ", ".join(quote(column) for column in ("minute", "tenant", "model"))
    row = "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
    per_statement = min(UPSERT_MAX_ROWS, (connection.features.max_query_params or 65_535) // len(_COLUMNS))
    tenant_limit, model_limit = _MINUTE_LIMITS["tenant"], _MINUTE_LIMITS["model"]
    # One order in every process: flushes adding to the same rows lock them in the same order.
    ordered = sorted(minutes.items(), key=lambda item: (item[0][2], item[0][0], item[0][1]))
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        for start in range(0, len(ordered), per_statement):
            chunk = ordered[start:start + per_statement]
            params: list[Any] = []
            for (tenant, model, minute), sums in chunk:
                params += [adapt(_minute_of(minute)), tenant[:tenant_limit], model[:model_limit], *sums]
            cursor.execute(
                f"INSERT INTO {table} ({names}) VALUES {', '.join([row] * len(chunk))} "
                f"ON CONFLICT ({conflict}) DO UPDATE SET {adds}",
                params,
            )


# The request log's columns in the order _log_row gives them (every field but the id).
_LOG_FIELDS = (
    "at", "request_id", "tenant", "model", "worker", "surface", "route", "status", "outcome", "error_code",
    "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "tokens_estimated", "latency_ms",
    "ttft_ms",
)  # fmt: skip
_LOG_COLUMNS = {f.name: str(f.column) for f in RequestLogEntry._meta.concrete_fields if not f.primary_key}
if set(_LOG_COLUMNS) != set(_LOG_FIELDS):  # a field added to the model is written here too
    raise ImproperlyConfigured(f"the request log's fields changed: {sorted(set(_LOG_COLUMNS) ^ set(_LOG_FIELDS))}")
# The binary COPY (_copy_binary) writes each field in its column's wire format: a type changed in the
# model must change it too.
_LOG_TYPES = {
    "at": "DateTimeField", "status": "PositiveSmallIntegerField", "tokens_estimated": "BooleanField",
    "latency_ms": "FloatField", "ttft_ms": "FloatField",
    **dict.fromkeys(("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens"), "BigIntegerField"),
}  # fmt: skip
_CHANGED_TYPES = sorted(
    name for name in _LOG_FIELDS
    if RequestLogEntry._meta.get_field(name).get_internal_type() != _LOG_TYPES.get(name, "CharField")
)  # fmt: skip
if _CHANGED_TYPES:
    raise ImproperlyConfigured(f"the request log's field types changed: {_CHANGED_TYPES}")


_DIGITS3 = [f"{n:03d}" for n in range(1000)]
# x + _ROUNDER - _ROUNDER is x rounded to an integer, half to even (as round() rounds), for 0 <= x <
# 2**51: the sum's unit in the last place is 1 and the addition rounds to nearest, ties to even. Two
# float operations where round() is a call through float.__round__ (D108).
_ROUNDER = 6755399441055744.0  # 1.5 * 2**52


def _second_text(seconds: dict[int, str], second: int, zone: tzinfo | None) -> str:
    """A whole second's SQLite text (``2026-11-28 14:47:16``, naive in ``zone``), kept in ``seconds``:
    made once per second a flush's rows share (they share a few)."""
    text = seconds[second] = _naive_text(second, zone)
    return text


def _naive_text(at: float, zone: tzinfo | None) -> str:
    """The SQLite text of a Unix time: the naive time in ``zone``, as Django's adapter stores it."""
    return str(datetime.fromtimestamp(at, zone).replace(tzinfo=None))


def stored_time() -> Callable[[float], Any]:
    """Unix seconds to the value the backend stores for a DateTimeField: what
    ``connection.ops.adapt_datetimefield_value`` gives for the aware datetime. On SQLite that is the
    text of the naive time in the connection's zone, made as :func:`_log_params` makes a row's:
    Django's adapter checks each value (expression, awareness, settings), and a datetime made,
    replaced and formatted per row cost about a fifth of the row's write."""
    if connection.vendor == "sqlite":
        return lambda at: _log_params([_timed(at)])[0][0]
    adapt = connection.ops.adapt_datetimefield_value
    return lambda at: adapt(datetime.fromtimestamp(at, UTC))


def _timed(at: float) -> AccountingEntry:
    return AccountingEntry(at, "", "", "", "", "", "", 0, Outcome.SUCCESS)


# No ttft (a whole answer) is written as this and stored as NULL by the statement (NULLIF): the
# SQLite module looks for an adapter, and fails at some length, for every parameter that is not an
# int, float, str or bytes, None and bool included.
_NO_TTFT = -1.0
# SQLite: the log's rows go by statements of this many rows at most (32 x 17 parameters, under the 999
# of older SQLite builds), and fewer by halves for the rest of a batch: six statement texts in all,
# each compiled once and kept in the connection's statement cache (D96).
_SQLITE_CHUNK_ROWS = 32
_MIDDLE_FIELDS = _LOG_FIELDS[2:10]  # tenant to error code: values the rows of a flush share
# A flush's rows grouped by their shared columns and minute: the key is tenant to error code's values
# (:data:`_MIDDLE_FIELDS`, the outcome as its text) and the minute (Unix seconds // 60, a float); the
# group holds those columns as the store takes them and the rows' usages, whose sums are the minute's
# (D116).
Groups = dict[tuple[Any, ...], tuple[Any, list[TokenUsage]]]
_SUCCESS_TEXT = Outcome.SUCCESS.value


def _fold_groups(minutes: dict[MinuteKey, list[int]], groups: Groups) -> None:
    """Add the rows' usages of each group to its (tenant, model, minute) sums: the minute sums of a
    flush whose log holds every request drained, made from the log's own loop (D116)."""
    for key, (_, usages) in groups.items():
        add_usages(minutes, (key[0], key[1], int(key[8])), key[6] != _SUCCESS_TEXT, usages)


def _cut_middle(middles: Groups, key: tuple[Any, ...]) -> tuple[Any, list[TokenUsage]]:
    """The SQLite parameters tenant to error code (:data:`_MIDDLE_FIELDS`) of ``key`` (their values and
    the minute), each text cut to its column's length, kept in ``middles`` with an empty list of usages."""
    cut = tuple(value if name == "status" else value[: _LOG_LIMITS[name]]
                for name, value in zip(_MIDDLE_FIELDS, key))  # fmt: skip
    group = middles[key] = (cut, [])
    return group


def _log_params(entries: list[AccountingEntry]) -> tuple[list[Any], Groups]:
    """The SQLite parameters of :data:`_LOG_FIELDS` for ``entries``, one flat list (a row after
    another). A time is the text of the naive time in the connection's zone: its second's text
    (:func:`_second_text`) and its microseconds, rounded as ``datetime.fromtimestamp`` rounds them
    (:data:`_ROUNDER`), as two texts of three digits from a table (a ``:06d`` format was a third of a
    row's time text: D96). Tenant to error code are looked up once per row by their values, cut once
    per flush (:func:`_cut_middle`: a subscript of a dict subclass is a slot call, and seven cuts a
    row were ~3k instructions). A boolean is the integer it stores, no time to first token
    :data:`_NO_TTFT`. The outcome's text is its ``_value_``: ``.value`` is a property call on Python
    3.11, and the member itself a str subclass the SQLite module adapts the slow way (D108). Also the
    rows' groups (:data:`Groups`: the lookup's key has the minute too), whose usages make the minute
    sums (:func:`_fold_groups`, D116)."""
    zone, digits, rounder = connection.timezone, _DIGITS3, _ROUNDER
    request_id, estimated, no_ttft, flags = _LOG_LIMITS["request_id"], EstimatedUsage, _NO_TTFT, (0, 1)
    seconds: dict[int, str] = {}
    middles: Groups = {}
    known_second, known_middle = seconds.get, middles.get
    params: list[Any] = []
    for entry in entries:
        at, usage, ttft = entry.at, entry.usage, entry.ttft_secs
        whole = floor(at)
        micros = floor((at - whole) * 1e6 + rounder - rounder)  # exact subtraction, as fromtimestamp
        if micros >= 1_000_000 or at < 0.0:
            text = _naive_text(at, zone)
        else:
            text = known_second(whole) or _second_text(seconds, whole, zone)
            if micros:
                text = f"{text}.{digits[micros // 1000]}{digits[micros % 1000]}"
        key = (entry.tenant, entry.model, entry.worker, entry.surface, entry.route, entry.status,
               entry.outcome._value_, entry.error_code, at // 60.0)
        middle, usages = known_middle(key) or _cut_middle(middles, key)
        usages.append(usage)
        params += (text, entry.request_id[:request_id])
        params += middle
        params += (usage.prompt, usage.completion, usage.cached, usage.reasoning, flags[type(usage) is estimated],
                   entry.latency_secs * 1000.0, no_ttft if ttft is None else ttft * 1000.0)
    return params, middles


# Postgres's binary COPY (https://www.postgresql.org/docs/current/sql-copy.html, "Binary Format"): the
# signature, no flags, no header extension; a row is its field count and each field's length (-1:
# NULL) and value, big-endian; a timestamptz is microseconds since 2000-01-01 UTC; the end is -1.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_COPY_TRAILER = b"\xff\xff"
_PG_EPOCH = 946_684_800.0  # 2000-01-01 UTC in Unix seconds
# A row's first fields: the field count, at (length, microseconds), the request id's length.
_ROW_HEAD = Struct(">hiqi").pack
# Its last: the four token counts, the estimate flag, the latency and the time to first token (or its
# NULL), each after its length.
_ROW_TAIL = Struct(">iqiqiqiqi?idid").pack
_ROW_TAIL_NO_TTFT = Struct(">iqiqiqiqi?idi").pack
_SMALLINT = Struct(">ih").pack  # a status, after its length
_LENGTH = Struct(">i").pack


def _binary_middle(middles: Groups, key: tuple[Any, ...]) -> tuple[Any, list[TokenUsage]]:
    """The binary fields tenant to error code (:data:`_MIDDLE_FIELDS`) of ``key`` (their values and the
    minute), kept in ``middles`` with an empty list of usages: each text cut to its column's length and
    encoded (UTF-8, the connection's encoding) after its length, the status a smallint."""
    parts = [_SMALLINT(2, value) if name == "status" else _binary_text(value[: _LOG_LIMITS[name]])
             for name, value in zip(_MIDDLE_FIELDS, key)]  # fmt: skip
    group = middles[key] = (b"".join(parts), [])
    return group


def _binary_text(value: str) -> bytes:
    encoded = value.encode()
    return _LENGTH(len(encoded)) + encoded


def _binary_micros(at: float) -> int:
    """A negative Unix time's timestamptz (microseconds since 2000), as ``datetime.fromtimestamp``
    rounds it (:func:`_copy_binary` makes the others directly)."""
    return (datetime.fromtimestamp(at, UTC) - datetime.fromtimestamp(_PG_EPOCH, UTC)) // timedelta(microseconds=1)


def _copy_binary(entries: list[AccountingEntry]) -> tuple[bytes, Groups]:
    """``entries``' rows (:data:`_LOG_FIELDS`) in COPY's binary format: no text made for a time, a
    count or a float (a float's shortest text, its ``repr``, costs ~3.7k instructions) and nothing
    escaped. Per row two packs, the request id cut and encoded, one lookup of tenant to error code by
    their values (:func:`_binary_middle`, made once per flush), and the time's microseconds rounded as
    ``datetime.fromtimestamp`` rounds them (:data:`_ROUNDER`) (D108). Also the rows' groups, as
    :func:`_log_params` gives them (D116)."""
    request_id, epoch, rounder, estimated = _LOG_LIMITS["request_id"], _PG_EPOCH, _ROUNDER, EstimatedUsage
    head, tail, tail_no_ttft = _ROW_HEAD, _ROW_TAIL, _ROW_TAIL_NO_TTFT
    middles: Groups = {}
    known = middles.get
    parts = [_COPY_HEADER]
    for entry in entries:
        at, usage, ttft = entry.at, entry.usage, entry.ttft_secs
        if at >= 0.0:
            whole = at // 1.0  # all exact: the float microseconds are integers under 2**53
            micros = floor((whole - epoch) * 1e6 + ((at - whole) * 1e6 + rounder - rounder))
        else:
            micros = _binary_micros(at)
        rid = entry.request_id[:request_id].encode()
        key = (entry.tenant, entry.model, entry.worker, entry.surface, entry.route, entry.status,
               entry.outcome._value_, entry.error_code, at // 60.0)
        middle, usages = known(key) or _binary_middle(middles, key)
        usages.append(usage)
        parts.append(head(17, 8, micros, len(rid)))
        parts.append(rid)
        parts.append(middle)
        if ttft is None:
            parts.append(tail_no_ttft(8, usage.prompt, 8, usage.completion, 8, usage.cached, 8, usage.reasoning,
                                      1, type(usage) is estimated, 8, entry.latency_secs * 1000.0, -1))
        else:
            parts.append(tail(8, usage.prompt, 8, usage.completion, 8, usage.cached, 8, usage.reasoning,
                              1, type(usage) is estimated, 8, entry.latency_secs * 1000.0, 8, ttft * 1000.0))
    parts.append(_COPY_TRAILER)
    return b"".join(parts), middles


def _packed_log(entries: list[AccountingEntry]) -> tuple[Callable[[], None], Groups]:
    """The request log's rows made for the store (no statement run yet): the write that inserts them,
    multi-row INSERTs on SQLite or one binary COPY on Postgres, and the rows' groups (their usages by
    tenant, model, minute and outcome). Not the ORM's bulk_create: a model instance per row and every
    field prepared through it cost about four times the row's own insert (issue 27, D82: a fifth of a
    relayed request's CPU went to the flusher's thread). On SQLite no parameter is None (D85)."""
    quote = connection.ops.quote_name
    table = quote(RequestLogEntry._meta.db_table)
    columns = ", ".join(quote(_LOG_COLUMNS[name]) for name in _LOG_FIELDS)
    if connection.vendor == "postgresql":
        data, groups = _copy_binary(entries)
        return lambda: _copy_log(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)", data), groups
    one = "(" + ", ".join(["?"] * (len(_LOG_FIELDS) - 1) + [f"NULLIF(?, {_NO_TTFT})"]) + ")"
    params, groups = _log_params(entries)
    return lambda: _insert_sqlite_log(f"INSERT INTO {table} ({columns}) VALUES ", one, params), groups


def _insert_sqlite_log(head: str, one: str, params: list[Any]) -> None:
    """The rows of ``params`` (:func:`_log_params`) inserted on SQLite by statements of
    :data:`_SQLITE_CHUNK_ROWS` rows, the rest by one statement each of 16, 8, 4, 2 and 1 rows as it
    needs: a statement executed once per row cost each row its own run of the statement (the table's
    AUTOINCREMENT counter read and written, the module's reset and step) and a row of 41k instructions
    came to 32k in chunks (D96). The qmark statements go to the sqlite3 cursor itself (Django's cursor
    would rewrite placeholders in the long text at every execution: D85 found multi-row statements
    dearer through it), and the whole write runs through the connection's execute wrappers as one
    statement with many parameters, as an ``executemany`` does (what watches a flush's statements
    sees one), with Django's error wrapping."""
    width = len(_LOG_FIELDS)
    texts: dict[int, str] = {}

    def statement(count: int) -> str:
        text = texts.get(count)
        if text is None:
            text = texts[count] = head + ", ".join([one] * count)
        return text

    def insert(sql: str, params: list[Any], many: bool, context: dict[str, Any]) -> None:
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            execute = sqlite3.Cursor.execute  # the module's own, not Django's placeholder rewrite
            raw = context["cursor"].cursor
            done, total = 0, len(params) // width
            count = _SQLITE_CHUNK_ROWS
            while done < total:
                while done + count > total:
                    count //= 2
                execute(raw, statement(count), params[done * width:(done + count) * width])
                done += count

    with connection.cursor() as cursor:
        cursor._execute_with_wrappers(statement(1), params, True, insert)


def _copy_log(sql: str, data: bytes) -> None:
    """``data`` (:func:`_copy_binary`) written by ``COPY ... FROM STDIN (FORMAT BINARY)`` on Postgres in
    one ``write``: psycopg's ``write_row`` of a tuple per row cost about three times the row made here
    (D85, amended; D108). Run through the connection's execute wrappers as a statement with many
    parameter rows, as Django runs an ``executemany``, so what watches the statements (tests,
    instrumentation) sees the COPY too, and with the same error wrapping (a refused store is an
    :class:`~django.db.OperationalError`)."""

    def copy(sql: str, data: list[bytes], many: bool, context: dict[str, Any]) -> None:
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            with context["cursor"].cursor.copy(sql) as stream:
                stream.write(data[0])

    with connection.cursor() as cursor:
        cursor._execute_with_wrappers(sql, [data], True, copy)


def write_usage(batch: Drained) -> None:
    """Write one drained batch in one transaction: the minute sums added, the log rows inserted. The
    log's rows are made first; when they are every request the batch drained (the usual flush), the
    minute sums are folded from the groups their loop makes (D116), else by the batch itself. Both
    are in ``batch.minutes`` before any statement runs, so a batch a refused store hands back to the
    ledger holds its sums."""
    if not batch:
        return
    insert_log: Callable[[], None] | None = None
    folds = batch.claim_log_fold()
    if batch.log:
        insert_log, groups = _packed_log(batch.log)
        if folds:
            _fold_groups(batch.minutes, groups)
    minutes = batch.minutes
    with transaction.atomic():
        if minutes:
            _upsert_minutes(minutes)
        if insert_log is not None:
            insert_log()


def _delete_in_batches(rows: QuerySet[Any], max_batches: int) -> int:
    """Delete these rows oldest id first, :data:`PRUNE_BATCH_ROWS` a statement (each its own
    transaction, so none holds the table long; no list of ids is sent), at most ``max_batches``
    statements."""
    removed = 0
    for _ in range(max_batches):
        last = list(rows.order_by("id").values_list("id", flat=True)[PRUNE_BATCH_ROWS - 1:PRUNE_BATCH_ROWS])
        batch = rows.filter(id__lte=last[0]) if last else rows
        deleted, _ = batch.delete()
        removed += deleted
        if not last:
            break
    return removed


def prune_request_log(max_rows: int, retention_days: int, now: datetime | None = None,
                      max_batches: int = PRUNE_MAX_BATCHES) -> int:
    """Delete request log rows older than ``retention_days`` (0: none by age), then all but the newest
    ``max_rows`` (0: none by count); returns how many went."""
    removed = 0
    if retention_days > 0:
        cutoff = (now or timezone.now()) - timedelta(days=retention_days)
        removed += _delete_in_batches(RequestLogEntry.objects.filter(at__lt=cutoff), max_batches)
    if max_rows > 0:
        newest_kept = list(
            RequestLogEntry.objects.order_by("-id").values_list("id", flat=True)[max_rows - 1:max_rows]
        )
        if newest_kept:
            removed += _delete_in_batches(RequestLogEntry.objects.filter(id__lt=newest_kept[0]), max_batches)
    return removed


@dataclass(frozen=True, slots=True)
class PurgeCounts:
    minutes: int
    log_rows: int


def delete_usage_before(cutoff: datetime) -> PurgeCounts:
    """Delete the usage minutes and request log rows before ``cutoff``, :data:`PRUNE_BATCH_ROWS` rows
    a statement (manage.py purgeusage)."""
    everything = 1 << 62
    minutes = _delete_in_batches(UsageMinute.objects.filter(minute__lt=cutoff), everything)
    log_rows = _delete_in_batches(RequestLogEntry.objects.filter(at__lt=cutoff), everything)
    return PurgeCounts(minutes, log_rows)


def fit_ledger(dp: DataPlane, config: GatewayConfig) -> None:
    """Size the data plane's ledger to --request-log-max-rows: no process holds more unflushed log
    rows than the log keeps (0: none). Called before the process serves (the ledger is empty)."""
    if dp.ledger.log_capacity != config.request_log_max_rows and not len(dp.ledger):
        dp.ledger = UsageLedger(config.request_log_max_rows)


def _bounded(batch: Drained) -> tuple[Drained, int]:
    """The batch with at most :data:`MAX_HELD_MINUTES` minute sums (the newest), and how many requests
    the dropped ones counted."""
    if len(batch.minutes) <= MAX_HELD_MINUTES:
        return batch, 0
    ordered = sorted(batch.minutes.items(), key=lambda item: item[0][2], reverse=True)
    kept = dict(ordered[:MAX_HELD_MINUTES])
    dropped = sum(sums[0] for _, sums in ordered[MAX_HELD_MINUTES:])
    return Drained(kept, batch.log), dropped


class UsageFlusher:
    """This process's flush loop. ``ledger`` gives the ledger to drain (the data plane's, read at each
    flush: a test's data plane may be replaced); ``leading`` says whether this process prunes the
    request log for its host."""

    def __init__(self, config: GatewayConfig, ledger: Callable[[], UsageLedger],
                 leading: Callable[[], bool] = lambda: True, write: Callable[[Drained], None] = write_usage) -> None:
        self.config = config
        self.ledger = ledger
        self.leading = leading
        self.write = write  # the store write of one batch (write_usage; tests wrap it to cut the store)
        self.flushes = 0  # successful flushes that wrote something
        self.failures = 0
        self.pruned = 0  # request log rows this process pruned
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._pruned_at = 0.0  # the event loop's clock at the last prune round
        self._dropped_logged = False

    def start(self) -> None:
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.ensure_future(self._run())

    async def astop(self) -> None:
        """Stop the loop after the flush under way, then flush what is left (the graceful shutdown's
        last write)."""
        if self._task is not None:
            self._stop.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.aflush()
        pending = len(self.ledger())
        if pending:
            log.warning("shutting down with %d usage sum(s) and log row(s) unwritten: the store refused them", pending)

    async def aflush(self) -> bool:
        """Drain the ledger and write it; on a store error put it back. True when nothing is left
        unwritten of what was drained."""
        async with self._lock:  # one flush at a time: a batch put back is carried by the next one
            ledger = self.ledger()
            batch = ledger.drain()
            if not batch:
                return True
            try:
                await arun_db(self.write, batch)
            except STORE_ERRORS:  # logged once as an outage (common.outages.STORE); kept for the next flush
                self.failures += 1
                kept, dropped = _bounded(batch)
                if dropped and not self._dropped_logged:
                    self._dropped_logged = True
                    log.warning("usage held for the store passed %d minute sums: %d request(s) of the oldest "
                                "minutes dropped", MAX_HELD_MINUTES, dropped)
                ledger.restore(kept)
                return False
            except Exception:
                self.failures += 1
                log.exception("writing usage failed; this batch (%d sums, %d log rows) is dropped",
                              len(batch.minutes), len(batch.log))
                return False
            self._dropped_logged = False
            self.flushes += 1
            return True

    async def aprune(self) -> int:
        """One prune round of the request log (the host's leader calls it every PRUNE_EVERY_SECS)."""
        try:
            removed = await arun_db(
                prune_request_log, self.config.request_log_max_rows, self.config.request_log_retention_days
            )
        except STORE_ERRORS:  # logged once as an outage; the next round tries again
            return 0
        self.pruned += removed
        if removed:
            log.debug("request log: %d row(s) pruned", removed)
        return removed

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.usage_flush_interval_secs
        self._pruned_at = loop.time()
        while not self._stop.is_set():
            now = loop.time()
            try:
                await asyncio.wait_for(self._stop.wait(), next_mark(now, interval) - now)
            except TimeoutError:
                pass
            if self._stop.is_set():
                return  # astop flushes the rest itself
            try:
                await self.aflush()
                if self.leading() and loop.time() - self._pruned_at >= PRUNE_EVERY_SECS:
                    self._pruned_at = loop.time()
                    await self.aprune()
            except Exception:  # never let the loop die: the next interval tries again
                log.exception("usage flush loop failed")

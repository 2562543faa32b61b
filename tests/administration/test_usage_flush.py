"""Usage's write side (administration/usage_flush.py): each process's ledger written in one transaction
per flush (minute sums added to the stored rows, log rows inserted), concurrent flushes summing
exactly, a refused flush carried by the next, the last flush on stop, and the request log pruned by
age and count by the host's leader. Runs on the suite's store: SQLite, or Postgres with DATABASE_URL."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection
from django.db.models import Sum

from administration import usage_flush
from administration.lifecycle import GatewayLifecycle
from administration.models import RequestLogEntry, UsageMinute
from administration.usage_flush import UsageFlusher, prune_request_log, write_usage
from common.config import ConfigError, GatewayConfig, install_config, parse_gateway_args
from common.outages import STORE
from inference.accounting import AccountingEntry, Drained, Outcome, TokenUsage, UsageLedger
from inference.dataplane import data_plane, reset_data_plane
from tests.conftest import until

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = 29_000_000  # a UTC minute (Unix seconds // 60): 2025-02-19 05:20


def entry(at: float, tenant: str = "acme", model: str = "m", outcome: Outcome = Outcome.SUCCESS,
          prompt: int = 10, completion: int = 5, request_id: str = "") -> AccountingEntry:
    return AccountingEntry(
        at=at, request_id=request_id or f"r{at}", tenant=tenant, model=model, worker="http://w:1", surface="chat",
        route="/v1/chat/completions", status=200 if outcome is Outcome.SUCCESS else 502, outcome=outcome,
        error_code="" if outcome is Outcome.SUCCESS else "upstream_error",
        usage=TokenUsage(prompt, completion, cached=2, reasoning=1), latency_secs=0.25,
        ttft_secs=0.05 if outcome is Outcome.SUCCESS else None,
    )


def stored() -> dict[tuple[str, str, datetime], tuple[int, ...]]:
    return {
        (row.tenant, row.model, row.minute): (row.requests, row.errors, row.prompt_tokens, row.completion_tokens,
                                              row.cached_tokens, row.reasoning_tokens)
        for row in UsageMinute.objects.all()
    }


def at_minute(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, UTC)


def test_the_flags() -> None:
    defaults = GatewayConfig()
    assert (defaults.usage_flush_interval_secs, defaults.request_log_max_rows,
            defaults.request_log_retention_days) == (5.0, 100_000, 30)
    config = parse_gateway_args(["--usage-flush-interval-secs", "0.5", "--request-log-max-rows", "0",
                                 "--request-log-retention-days", "7"])
    assert (config.usage_flush_interval_secs, config.request_log_max_rows, config.request_log_retention_days) == (
        0.5, 0, 7)
    with pytest.raises(ConfigError, match="greater than 0"):
        parse_gateway_args(["--usage-flush-interval-secs", "0"])


def test_log_rows_read_back_as_written_with_times_a_second_shares() -> None:
    """The log's rows as the ORM reads them back: times of one second and of others (a second's text
    made once, its microseconds rounded as datetime.fromtimestamp rounds them), no time to first token
    stored as NULL and a zero kept, the estimate flag both ways (D85)."""
    from inference.accounting import EstimatedUsage

    times = [1_795_840_099.0, 1_795_840_099.887711, 1_795_840_099.5, 1_795_840_099.9999996, 1_795_840_100.000001,
             1_000_000_000.5, 1_795_881_600.25]
    ledger = UsageLedger()
    for n, at in enumerate(times):
        made = entry(at, request_id=f"t{n}")
        made.ttft_secs = (None, 0.0, 0.125)[n % 3]
        if n % 2:
            made.usage = EstimatedUsage(7, 3)
        ledger.add(made)
    write_usage(ledger.drain())
    rows = list(RequestLogEntry.objects.order_by("id"))
    assert [row.at for row in rows] == [datetime.fromtimestamp(at, UTC) for at in times]
    assert [row.ttft_ms for row in rows] == [(None, 0.0, 125.0)[n % 3] for n in range(len(times))]
    assert [row.tokens_estimated for row in rows] == [bool(n % 2) for n in range(len(times))]
    assert RequestLogEntry.objects.filter(ttft_ms__isnull=True).count() == 3
    assert RequestLogEntry.objects.filter(tokens_estimated=True).count() == 3


def test_log_rows_cut_to_their_columns_and_times_before_1970_read_back() -> None:
    """A request id past its column's 128 characters (a client's token may have 256) and a tenant past
    its 255 are cut to them, beyond ASCII too; a time before 1970 (the rows' other path to their
    microseconds) and one whose microseconds round up to the next second read back as
    datetime.fromtimestamp gives them; rows of one tenant and model share their middle fields but
    keep their own status, outcome and error code; on both stores (D108)."""
    times = [-1.25, -86_400.000_000_4, 1_795_840_099.999_999_6, 1_795_840_099.000_000_5, 0.0]
    ledger = UsageLedger()
    for n, at in enumerate(times):
        outcome = (Outcome.SUCCESS, Outcome.UPSTREAM_ERROR)[n % 2]
        tenant, request_id = "t" * 300 if n == 0 else "acme", "é" * 200 if n == 1 else f"x{n}"
        ledger.add(entry(at, tenant=tenant, outcome=outcome, request_id=request_id))
    write_usage(ledger.drain())
    rows = list(RequestLogEntry.objects.order_by("id"))
    assert [row.at for row in rows] == [datetime.fromtimestamp(at, UTC) for at in times]
    assert [(row.request_id, row.tenant) for row in rows] == [
        ("x0", "t" * 255), ("é" * 128, "acme"), ("x2", "acme"), ("x3", "acme"), ("x4", "acme")]
    assert [(row.status, row.outcome, row.error_code) for row in rows] == [
        (200, "success", ""), (502, "upstream_error", "upstream_error")] * 2 + [(200, "success", "")]


def test_the_rounder_rounds_halves_to_even_as_round_does() -> None:
    """_ROUNDER's two additions give round()'s integer (ties to even) over a row's microseconds' range."""
    values = [n + 0.5 for n in range(2_000)] + [999_999.5, 999_998.5, 0.49999999999999994, 999_999.4999999999]
    values += [n / 7 * 3 for n in range(0, 2_333_333, 997)]
    assert [int(v + usage_flush._ROUNDER - usage_flush._ROUNDER) for v in values] == [round(v) for v in values]


def test_log_rows_text_read_back_exactly_with_what_copy_escapes() -> None:
    """Text with COPY's special characters (tab, newline, carriage return, backslash, a backslash-dot
    line, the text of NULL) and beyond ASCII reads back as written, every column, on both stores (on
    Postgres the rows go by COPY: D85, amended); latencies and counts exactly too."""
    texts = ["a\tb", "line\nnext\r\n", "back\\slash\\", "\\.", "\\N", "\\t not a tab", "zé 東京 🙂", "", " ",
             "'quoted\" \\x41"]
    ledger = UsageLedger()
    for n, text in enumerate(texts):
        made = entry(1_795_840_099.123456 + n, request_id=f"{text}|{n}", tenant=text, model=text)
        made.worker, made.surface, made.route, made.error_code = text, text[:16], text, text[:16]
        made.latency_secs, made.ttft_secs = 0.1 + n / 3, None if n % 2 else n / 7
        ledger.add(made)
    write_usage(ledger.drain())
    rows = list(RequestLogEntry.objects.order_by("id"))
    assert [(row.request_id, row.tenant, row.model, row.worker, row.surface, row.route, row.error_code)
            for row in rows] == [(f"{text}|{n}", text, text, text, text[:16], text, text[:16])
                                 for n, text in enumerate(texts)]
    assert [(row.latency_ms, row.ttft_ms, row.prompt_tokens, row.completion_tokens, row.cached_tokens,
             row.reasoning_tokens, row.status, row.outcome) for row in rows] == [
        ((0.1 + n / 3) * 1000.0, None if n % 2 else n / 7 * 1000.0, 10, 5, 2, 1, 200, "success")
        for n in range(len(texts))]


def test_the_log_rows_write_is_seen_inside_the_flush_transaction() -> None:
    """The log's rows are written by a statement the connection's execute wrappers see, inside the
    flush's transaction: on Postgres the COPY (which psycopg runs outside Django's cursor.execute)
    goes through them too, so what counts a flush's statements counts it (D85, amended)."""
    ledger = UsageLedger()
    for n in range(5):
        ledger.add(entry(MINUTE * 60 + n))
    seen: list[tuple[str, bool, bool]] = []

    def watch(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if not sql.startswith("BEGIN"):
            seen.append((sql.split(" ", 1)[0], many, connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        write_usage(ledger.drain())
    log_write = "COPY" if connection.vendor == "postgresql" else "INSERT"
    assert seen == [("INSERT", False, True), (log_write, True, True)]
    assert RequestLogEntry.objects.count() == 5


async def test_a_flush_adds_to_the_stored_sums_and_inserts_the_log_rows() -> None:
    ledger = UsageLedger()
    flusher = UsageFlusher(GatewayConfig(), lambda: ledger)
    second = MINUTE * 60
    ledger.add(entry(second + 1))
    ledger.add(entry(second + 2, outcome=Outcome.UPSTREAM_ERROR, prompt=3, completion=0))
    ledger.add(entry(second + 3, tenant=":shared"))
    assert await flusher.aflush()
    ledger.add(entry(second + 30, request_id="x" * 300))  # the same minute, a later flush: added to the row
    ledger.add(entry(second + 61))  # the next minute
    assert await flusher.aflush()
    assert flusher.flushes == 2 and not len(ledger)

    rows = await asyncio.to_thread(stored)
    assert rows == {
        ("acme", "m", at_minute(MINUTE)): (3, 1, 23, 10, 6, 3),
        (":shared", "m", at_minute(MINUTE)): (1, 0, 10, 5, 2, 1),
        ("acme", "m", at_minute(MINUTE + 1)): (1, 0, 10, 5, 2, 1),
    }
    log = await asyncio.to_thread(lambda: list(RequestLogEntry.objects.order_by("id")))
    assert [row.request_id for row in log] == [f"r{second + 1}", f"r{second + 2}", f"r{second + 3}", "x" * 128,
                                                f"r{second + 61}"]
    failed = log[1]
    assert (failed.at, failed.tenant, failed.model, failed.worker, failed.surface, failed.route) == (
        datetime.fromtimestamp(second + 2, UTC), "acme", "m", "http://w:1", "chat", "/v1/chat/completions")
    assert (failed.status, failed.outcome, failed.error_code, failed.prompt_tokens, failed.completion_tokens,
            failed.cached_tokens, failed.reasoning_tokens, failed.latency_ms, failed.ttft_ms) == (
        502, "upstream_error", "upstream_error", 3, 0, 2, 1, 250.0, None)
    assert log[0].ttft_ms == 50.0


def test_one_flush_is_one_transaction() -> None:
    """Many keys (more than one upsert statement takes on SQLite) and many log rows: one commit."""
    ledger = UsageLedger()
    for n in range(300):
        ledger.add(entry(MINUTE * 60 + n % 60, tenant=f"t{n}"))
    commits: list[str] = []
    statements: list[bool] = []

    def watch(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if not sql.startswith("BEGIN"):  # SQLite starts its transaction with a statement
            statements.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    real_commit = connection.commit

    def commit() -> None:
        commits.append("commit")
        real_commit()

    connection.commit = commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(watch):
            write_usage(ledger.drain())
    finally:
        del connection.commit
    assert commits == ["commit"]
    assert len(statements) >= 2 and all(statements)  # every statement inside the one transaction
    assert UsageMinute.objects.count() == 300 and RequestLogEntry.objects.count() == 300


def test_two_ledgers_flushing_at_once_sum_exactly() -> None:
    """Two processes (or hosts) adding to the same rows at the same moment: every flush is counted."""
    rounds, per_round = 20, 7
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def process(name: str) -> None:
        try:
            start.wait(timeout=30)
            for n in range(rounds):
                ledger = UsageLedger()
                for k in range(per_round):
                    ledger.add(entry(MINUTE * 60 + k * 20, tenant=("acme", "globex")[k % 2], model=name if k == 0 else "m",
                                     prompt=n + 1, completion=k))
                write_usage(ledger.drain())
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=process, args=(name,)) for name in ("p1", "p2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    prompt_per_process = sum(n + 1 for n in range(rounds)) * per_round
    totals = UsageMinute.objects.aggregate(Sum("requests"), Sum("prompt_tokens"), Sum("completion_tokens"))
    assert totals == {"requests__sum": 2 * rounds * per_round, "prompt_tokens__sum": 2 * prompt_per_process,
                      "completion_tokens__sum": 2 * rounds * sum(range(per_round))}
    # Rows both processes add to (k = 1..6 over three minutes) hold both processes' sums.
    acme = UsageMinute.objects.get(tenant="acme", model="m", minute=at_minute(MINUTE))  # k = 1
    assert acme.requests == 2 * rounds
    assert RequestLogEntry.objects.count() == 2 * rounds * per_round


async def test_a_refused_flush_is_carried_by_the_next(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="common.outages")
    refusals = [OperationalError("connection to server at 127.0.0.1 failed: Connection refused")]

    def cut_then_restored(batch: Drained) -> None:
        if refusals:
            raise refusals.pop()
        write_usage(batch)

    ledger = UsageLedger()
    flusher = UsageFlusher(GatewayConfig(), lambda: ledger, write=cut_then_restored)
    ledger.add(entry(MINUTE * 60 + 1))
    ledger.add(entry(MINUTE * 60 + 2))
    try:
        assert not await flusher.aflush()
        assert STORE.down and len(ledger) == 3  # one minute's sums and two log rows, held
        ledger.add(entry(MINUTE * 60 + 3))  # served meanwhile
        assert await flusher.aflush()
    finally:
        STORE.recovered()
    assert not STORE.down and (flusher.failures, flusher.flushes) == (1, 1)
    rows = await asyncio.to_thread(stored)
    assert rows == {("acme", "m", at_minute(MINUTE)): (3, 0, 30, 15, 6, 3)}
    ids = await asyncio.to_thread(lambda: list(RequestLogEntry.objects.order_by("id").values_list("request_id", flat=True)))
    assert ids == [f"r{MINUTE * 60 + n}" for n in (1, 2, 3)]
    outage = [r.getMessage() for r in caplog.records if "the store (database)" in r.getMessage()]
    assert len(outage) == 2 and "unavailable" in outage[0] and "reachable again" in outage[1]


async def test_what_a_refused_flush_holds_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_flush, "MAX_HELD_MINUTES", 2)

    def refused(batch: Drained) -> None:
        raise OperationalError("the database system is shutting down")

    ledger = UsageLedger(log_capacity=3)
    flusher = UsageFlusher(GatewayConfig(), lambda: ledger, write=refused)
    for minute in range(5):
        ledger.add(entry((MINUTE + minute) * 60))
    try:
        assert not await flusher.aflush()
    finally:
        STORE.recovered()
    held = ledger.drain()
    assert sorted(key[2] for key in held.minutes) == [MINUTE + 3, MINUTE + 4]  # the newest minutes
    assert [e.at for e in held.log] == [(MINUTE + m) * 60.0 for m in (2, 3, 4)]  # the ledger's log bound


async def test_the_loop_flushes_every_interval_and_stop_flushes_the_rest() -> None:
    ledger = UsageLedger()
    flusher = UsageFlusher(GatewayConfig(usage_flush_interval_secs=0.1), lambda: ledger)
    flusher.start()
    try:
        ledger.add(entry(MINUTE * 60))

        async def written() -> bool:
            return await asyncio.to_thread(UsageMinute.objects.exists)

        await until(written)
    finally:
        await flusher.astop()
    slow = UsageFlusher(GatewayConfig(usage_flush_interval_secs=3600), lambda: ledger)
    slow.start()
    ledger.add(entry(MINUTE * 60 + 1))
    ledger.add(entry(MINUTE * 60 + 2))
    await slow.astop()  # no interval passed: the stop's own flush writes them
    rows = await asyncio.to_thread(stored)
    assert rows == {("acme", "m", at_minute(MINUTE)): (3, 0, 30, 15, 6, 3)}
    assert not len(ledger)


async def test_a_graceful_stop_of_the_gateway_flushes_its_ledger() -> None:
    """The lifecycle starts a flusher with the gateway and its stop (after the requests in flight and
    the background runs) writes what the data plane's ledger holds."""
    config = GatewayConfig(prometheus_port=0, usage_flush_interval_secs=3600, request_log_max_rows=50)
    install_config(config, export=False)
    lifecycle = GatewayLifecycle()
    thresholds = gc.get_threshold()
    try:
        await lifecycle.astart()
        assert lifecycle.usage is not None and data_plane().ledger.log_capacity == 50
        data_plane().account(entry(MINUTE * 60 + 5, tenant="globex"))
        await lifecycle.astop()
    finally:
        gc.unfreeze()  # what a serving process does once, undone for the rest of the suite
        gc.set_threshold(*thresholds)
        install_config(GatewayConfig(), export=False)
        reset_data_plane(GatewayConfig())
    assert lifecycle.usage is None
    rows = await asyncio.to_thread(stored)
    assert rows == {("globex", "m", at_minute(MINUTE)): (1, 0, 10, 5, 2, 1)}


def _log_rows(ages_in_days: list[float]) -> None:
    now = datetime.now(UTC)
    RequestLogEntry.objects.bulk_create([
        RequestLogEntry(at=now - timedelta(days=age), request_id=f"r{n}", tenant="acme", model="m", surface="chat",
                        route="/v1/chat/completions", status=200, outcome="success", latency_ms=1.0)
        for n, age in enumerate(ages_in_days)
    ])


def test_pruning_keeps_the_newest_rows_within_the_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_flush, "PRUNE_BATCH_ROWS", 4)  # several batches
    _log_rows([40.0] * 9 + [1.0] * 20)  # ids 1-9 older than 30 days
    assert prune_request_log(max_rows=12, retention_days=30) == 9 + 8
    kept = list(RequestLogEntry.objects.order_by("id").values_list("request_id", flat=True))
    assert kept == [f"r{n}" for n in range(17, 29)]  # the newest 12
    assert prune_request_log(max_rows=12, retention_days=30) == 0
    assert prune_request_log(max_rows=0, retention_days=0) == 0  # both off: nothing goes


def test_a_prune_round_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_flush, "PRUNE_BATCH_ROWS", 3)
    _log_rows([50.0] * 10)
    assert prune_request_log(max_rows=0, retention_days=30, max_batches=2) == 6
    assert prune_request_log(max_rows=0, retention_days=30, max_batches=2) == 4


async def test_only_the_hosts_leader_prunes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_flush, "PRUNE_EVERY_SECS", 0.0)  # a prune round after every flush
    await asyncio.to_thread(_log_rows, [40.0] * 3)
    config = GatewayConfig(usage_flush_interval_secs=0.05)
    ledger = UsageLedger()
    follower = UsageFlusher(config, lambda: ledger, leading=lambda: False)
    follower.start()
    try:
        for n in range(2):  # two flushes by the loop, with no prune round after either
            ledger.add(entry(MINUTE * 60 + n))
            await until(lambda: asyncio.to_thread(lambda: len(ledger) == 0))
    finally:
        await follower.astop()
    assert follower.flushes == 2 and follower.pruned == 0
    assert await asyncio.to_thread(RequestLogEntry.objects.count) == 5  # 3 of 40 days ago, 2 of 2025: all kept
    leader = UsageFlusher(config, lambda: ledger, leading=lambda: True)
    leader.start()
    try:
        ledger.add(entry(MINUTE * 60 + 2))
        await until(lambda: asyncio.to_thread(lambda: leader.pruned > 0))
    finally:
        await leader.astop()
    # Every row is past the 30 days (40 days old, or of 2025 as flushed here).
    assert leader.pruned == 6 and not await asyncio.to_thread(RequestLogEntry.objects.exists)


def test_a_log_rows_time_is_what_djangos_adapter_stores() -> None:
    """stored_time writes the value Django's own adapter would (on SQLite: made directly), for times
    with and without a fraction of a second, so the ORM reads the rows' times back unchanged."""
    to_stored = usage_flush.stored_time()
    for at in (1_795_840_099.0, 1_795_840_099.887711, 1_000_000_000.5, 1_795_881_600.000001):
        assert to_stored(at) == connection.ops.adapt_datetimefield_value(datetime.fromtimestamp(at, UTC))


async def test_a_flush_refused_inside_its_transaction_is_carried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The minute sums of a usual flush are folded from the log's own rows (D116) before any statement
    runs: a store that refuses the transaction gets the batch back with its sums, and the next flush
    writes them once, the log's rows too; with no log the sums are folded from the entries alone."""
    real_upsert = usage_flush._upsert_minutes
    refusals = [OperationalError("connection to server at 127.0.0.1 failed: Connection refused")]

    def upsert(minutes: dict) -> None:  # type: ignore[type-arg]
        if refusals:
            raise refusals.pop()
        real_upsert(minutes)

    monkeypatch.setattr(usage_flush, "_upsert_minutes", upsert)
    ledger = UsageLedger()
    flusher = UsageFlusher(GatewayConfig(), lambda: ledger)
    ledger.add(entry(MINUTE * 60 + 1))
    ledger.add(entry(MINUTE * 60 + 2, outcome=Outcome.UPSTREAM_ERROR, tenant="globex"))
    try:
        assert not await flusher.aflush()
        ledger.add(entry(MINUTE * 60 + 61))
        assert await flusher.aflush()
    finally:
        STORE.recovered()
    off = UsageLedger(log_capacity=0)
    off.add(entry(MINUTE * 60 + 3))
    await asyncio.to_thread(write_usage, off.drain())
    assert await asyncio.to_thread(stored) == {
        ("acme", "m", at_minute(MINUTE)): (2, 0, 20, 10, 4, 2),
        ("globex", "m", at_minute(MINUTE)): (1, 1, 10, 5, 2, 1),
        ("acme", "m", at_minute(MINUTE + 1)): (1, 0, 10, 5, 2, 1),
    }
    ids = await asyncio.to_thread(lambda: list(RequestLogEntry.objects.order_by("id").values_list("request_id", flat=True)))
    assert ids == [f"r{MINUTE * 60 + n}" for n in (1, 2, 61)]

"""No database work on a request's path: a burst of real requests relayed to a real worker makes no
transaction in the store, on any connection of any thread, and each flush of what they used is one
transaction. Runs on the suite's store (SQLite, or Postgres with DATABASE_URL)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Sum

from administration.models import RequestLogEntry, UsageMinute
from administration.usage_flush import UsageFlusher
from common.config import GatewayConfig
from inference.dataplane import data_plane
from tests.conftest import RunningWorker

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": "hello"}]}
BURST = 40


@dataclass
class StoreTransactions:
    """Every statement and commit on every connection of the process, whatever its thread: a
    transaction is a commit, or a statement run in autocommit (outside any transaction)."""

    statements: list[str] = field(default_factory=list)
    commits: int = 0
    autocommitted: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return self.commits + self.autocommitted

    def reset(self) -> None:
        with self.lock:
            self.statements.clear()
            self.commits = self.autocommitted = 0


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreTransactions]:
    seen = StoreTransactions()
    execute = CursorWrapper._execute_with_wrappers
    commit = BaseDatabaseWrapper.commit

    def counted_execute(self: CursorWrapper, sql: str, params: Any, many: bool, executor: Any) -> Any:
        with seen.lock:
            if not sql.startswith("BEGIN"):  # SQLite's start of a transaction, counted by its commit
                seen.statements.append(sql)
                if not self.db.in_atomic_block and self.db.get_autocommit():
                    seen.autocommitted += 1
        return execute(self, sql, params, many, executor)

    def counted_commit(self: BaseDatabaseWrapper) -> None:
        with seen.lock:
            seen.commits += 1
        commit(self)

    monkeypatch.setattr(CursorWrapper, "_execute_with_wrappers", counted_execute)
    monkeypatch.setattr(BaseDatabaseWrapper, "commit", counted_commit)
    yield seen


async def burst(gateway: Any) -> list[int]:
    """BURST requests at once, every other one streamed."""
    answers = await asyncio.gather(*(
        gateway.post("/v1/chat/completions", json={**CHAT, "stream": n % 2 == 1}) for n in range(BURST)
    ))
    return [answer.status_code for answer in answers]


async def test_a_burst_makes_no_transaction_and_a_flush_makes_one(
    gateway: Any, worker: RunningWorker, transactions: StoreTransactions
) -> None:
    flusher = UsageFlusher(GatewayConfig(usage_flush_interval_secs=3600), lambda: data_plane().ledger)
    flusher.start()  # running, but no interval passes during the bursts
    try:
        for round_ in (1, 2):
            transactions.reset()
            assert await burst(gateway) == [200] * BURST
            assert (transactions.count, transactions.statements) == (0, [])  # nothing on the requests' path
            pending = data_plane().ledger.drain()
            assert sum(sums[0] for sums in pending.minutes.values()) == BURST and len(pending.log) == BURST
            data_plane().ledger.restore(pending)

            assert await flusher.aflush()
            assert (transactions.commits, transactions.autocommitted) == (1, 0), transactions.statements
            assert flusher.flushes == round_
    finally:
        await flusher.astop()

    def totals() -> tuple[dict[str, Any], int]:
        sums = UsageMinute.objects.aggregate(Sum("requests"), Sum("errors"), Sum("completion_tokens"))
        return sums, RequestLogEntry.objects.filter(status=200, outcome="success").count()

    sums, logged = await asyncio.to_thread(totals)
    assert (sums["requests__sum"], sums["errors__sum"], logged) == (2 * BURST, 0, 2 * BURST)
    assert sums["completion_tokens__sum"] > 0

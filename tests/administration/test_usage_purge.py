"""manage.py purgeusage: usage minutes and request log rows before a day (or older than some days) are
deleted in batches and counted; newer rows stay; a bad date or both options is an error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from administration import usage_flush
from administration.models import RequestLogEntry, UsageMinute

pytestmark = pytest.mark.django_db(transaction=True)


def purge(*args: str) -> str:
    out = StringIO()
    call_command("purgeusage", *args, stdout=out)
    return out.getvalue()


def rows_at(*moments: datetime) -> None:
    for n, moment in enumerate(moments):
        UsageMinute.objects.create(tenant="acme", model=f"m{n}", minute=moment, requests=1)
        RequestLogEntry.objects.create(at=moment, request_id=f"r{n}", tenant="acme", model="m", surface="chat",
                                       route="/v1/chat/completions", status=200, outcome="success", latency_ms=1.0)


def test_before_a_day_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_flush, "PRUNE_BATCH_ROWS", 2)  # several batches
    old = [datetime(2026, 3, 31, 23, 59, tzinfo=UTC) - timedelta(minutes=n) for n in range(5)]
    kept = [datetime(2026, 4, 1, 0, 0, tzinfo=UTC), datetime(2026, 5, 2, tzinfo=UTC)]
    rows_at(*old, *kept)
    output = purge("--before", "2026-04-01")
    assert "Purged 5 usage minute(s) and 5 request log row(s) before 2026-04-01 00:00:00 UTC." in output
    assert sorted(UsageMinute.objects.values_list("minute", flat=True)) == kept
    assert sorted(RequestLogEntry.objects.values_list("at", flat=True)) == kept
    assert "Purged 0 usage minute(s) and 0 request log row(s)" in purge("--before", "2026-04-01")


def test_older_than_days() -> None:
    now = datetime.now(UTC)
    rows_at(now - timedelta(days=10), now - timedelta(days=8), now - timedelta(days=1))
    assert "Purged 2 usage minute(s) and 2 request log row(s)" in purge("--older-than-days", "7")
    assert UsageMinute.objects.count() == 1 and RequestLogEntry.objects.count() == 1


@pytest.mark.parametrize("args", [(), ("--before", "2026-13-01"), ("--older-than-days", "-1"),
                                  ("--before", "2026-01-01", "--older-than-days", "3")])
def test_bad_arguments(args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError):
        purge(*args)

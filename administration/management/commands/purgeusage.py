"""manage.py purgeusage: delete usage minutes and request log rows older than a date, in batches, and
print what went."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from administration.usage_flush import delete_usage_before


class Command(BaseCommand):
    help = (
        "Delete per-minute usage sums and request log rows older than a date (--before YYYY-MM-DD, UTC "
        "midnight) or than a number of days (--older-than-days N), in batches. Spend and /usage read the "
        "usage sums: what is purged is gone from them too."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--before", metavar="YYYY-MM-DD", help="delete rows before this UTC day")
        parser.add_argument("--older-than-days", type=int, metavar="N", help="delete rows older than N days")

    def handle(self, *args: Any, **options: Any) -> None:
        before: str | None = options["before"]
        days: int | None = options["older_than_days"]
        if (before is None) == (days is None):
            raise CommandError("give one of --before YYYY-MM-DD or --older-than-days N")
        if before is not None:
            try:
                day = date.fromisoformat(before)
            except ValueError:
                raise CommandError(f"--before: not a date YYYY-MM-DD: {before!r}") from None
            cutoff = datetime(day.year, day.month, day.day, tzinfo=UTC)
        else:
            assert days is not None
            if days < 0:
                raise CommandError("--older-than-days must be 0 or more")
            cutoff = timezone.now() - timedelta(days=days)
        counts = delete_usage_before(cutoff)
        self.stdout.write(
            f"Purged {counts.minutes} usage minute(s) and {counts.log_rows} request log row(s) "
            f"before {cutoff:%Y-%m-%d %H:%M:%S} UTC."
        )

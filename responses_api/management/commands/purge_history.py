"""manage.py purge_history: delete stored responses and conversations older than the retention
(--history-retention-days, default 30) and the items nothing holds any more; prints the counts."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.config import current_config
from responses_api.retention import purge_history, purge_unstored, retention_cutoff


class Command(BaseCommand):
    help = (
        "Delete stored responses and conversations with no activity for the retention period "
        "(--history-retention-days, GW_HISTORY_RETENTION_DAYS; default 30, 0 keeps them forever)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days", type=int, default=None,
            help="retention in days for this run (default: --history-retention-days; 0 purges nothing)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["days"] if options["days"] is not None else current_config().history_retention_days
        if days < 0:
            raise CommandError("--days must be 0 or more")
        unstored = purge_unstored()
        self.stdout.write(f"Purged {unstored} unstored background response(s) ended over ten minutes ago.")
        cutoff = retention_cutoff(days)
        if cutoff is None:
            self.stdout.write("Retention is 0 days: history is kept forever; nothing purged.")
            return
        counts = purge_history(cutoff)
        self.stdout.write(
            f"Purged {counts.responses} response(s), {counts.conversations} conversation(s) and "
            f"{counts.items} item(s) with no activity since {cutoff:%Y-%m-%d %H:%M:%S} UTC ({days} days)."
        )

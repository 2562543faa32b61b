"""Accounting: what each inference request used, recorded by the turn runner into this process's
in-memory ledger and flushed to the store off the request path (docs/DECISIONS.md D66)."""

from inference.accounting.delivered import BROKEN, CLEAN, LATER, Delivered
from inference.accounting.entry import OPEN_SCOPE, SHARED_SCOPE, AccountingEntry, EstimatedUsage, Outcome, TokenUsage
from inference.accounting.ledger import MINUTE_FIELDS, Drained, MinuteKey, UsageLedger, add_usages, fold_minutes

__all__ = [
    "AccountingEntry", "Outcome", "Delivered", "CLEAN", "BROKEN", "LATER", "TokenUsage", "EstimatedUsage",
    "SHARED_SCOPE", "OPEN_SCOPE",
    "UsageLedger", "Drained", "MinuteKey", "MINUTE_FIELDS", "add_usages", "fold_minutes",
]

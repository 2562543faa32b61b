"""This process's usage since the last flush, in memory: sums by (tenant, model, UTC minute) and the
request log's new rows. The turn runner adds an entry per request (a dict update, no I/O); the
control side drains it every --usage-flush-interval-secs into one bulk upsert, and on a graceful
shutdown. A crash loses at most what was added since the last drain."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inference.accounting.entry import AccountingEntry, Outcome

__all__ = ["UsageLedger", "Drained", "MinuteKey", "MINUTE_FIELDS"]

MinuteKey = tuple[str, str, int]  # tenant, model, minute (Unix seconds // 60)
# The order of a minute's sums: the UsageMinute columns they add to.
MINUTE_FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")
_SUCCESS = Outcome.SUCCESS  # a member read through its enum class is a descriptor call (D85)


@dataclass(slots=True)
class Drained:
    minutes: dict[MinuteKey, list[int]] = field(default_factory=dict)
    log: list[AccountingEntry] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.minutes or self.log)


class UsageLedger:
    """Bounded: at most ``log_capacity`` unflushed log rows are kept (the oldest go first when the store
    is away that long); the minute sums grow with distinct (tenant, model, minute) only."""

    __slots__ = ("_minutes", "_log", "log_capacity")

    def __init__(self, log_capacity: int = 100_000) -> None:
        self.log_capacity = log_capacity
        self._minutes: dict[MinuteKey, list[int]] = {}
        self._log: deque[AccountingEntry] = deque(maxlen=log_capacity or None)

    def add(self, entry: AccountingEntry) -> None:
        key = (entry.tenant, entry.model, int(entry.at // 60))
        sums = self._minutes.get(key)
        if sums is None:
            sums = self._minutes[key] = [0, 0, 0, 0, 0, 0]
        usage = entry.usage
        sums[0] += 1
        if entry.outcome is not _SUCCESS:
            sums[1] += 1
        sums[2] += usage.prompt
        sums[3] += usage.completion
        sums[4] += usage.cached
        sums[5] += usage.reasoning
        if self.log_capacity:
            self._log.append(entry)

    def drain(self) -> Drained:
        """Everything added since the last drain, leaving the ledger empty."""
        drained = Drained(self._minutes, list(self._log))
        self._minutes = {}
        self._log.clear()
        return drained

    def restore(self, drained: Drained) -> None:
        """Put back what a failed flush could not write, so the next flush carries it."""
        for key, sums in drained.minutes.items():
            mine = self._minutes.get(key)
            if mine is None:
                self._minutes[key] = sums
            else:
                for i, value in enumerate(sums):
                    mine[i] += value
        if self.log_capacity:
            newer = list(self._log)
            self._log.clear()
            self._log.extend(drained.log)
            self._log.extend(newer)

    def __len__(self) -> int:
        return len(self._minutes) + len(self._log)

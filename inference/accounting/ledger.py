"""This process's usage since the last flush, in memory: the requests' entries as they finished, and
what a refused flush put back. The turn runner appends each request's entry (one list append, no I/O,
no sums: D116); the control side drains the ledger every --usage-flush-interval-secs (a swap of two
containers on the event loop) and the flush's thread folds the entries into sums by (tenant, model,
UTC minute) when it reads the batch's ``minutes``, then writes them as one bulk upsert, and the
newest ``log_capacity`` entries as the request log's rows. A crash loses at most what was added since
the last drain."""

from __future__ import annotations

from typing import Iterable

from inference.accounting.entry import AccountingEntry, Outcome, TokenUsage

__all__ = ["UsageLedger", "Drained", "MinuteKey", "MINUTE_FIELDS", "fold_minutes", "add_usages", "FOLD_EVERY"]

MinuteKey = tuple[str, str, int]  # tenant, model, minute (Unix seconds // 60)
# The order of a minute's sums: the UsageMinute columns they add to.
MINUTE_FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")
_SUCCESS = Outcome.SUCCESS  # a member read through its enum class is a descriptor call (D85)
# Unflushed entries past this many are folded into sums on the request that reaches it (and the log
# cut to its capacity), so a flush that cannot finish (a store that hangs) holds bounded memory as the
# sums and the bounded log did before (D116).
FOLD_EVERY = 65_536


def fold_minutes(minutes: dict[MinuteKey, list[int]], entries: Iterable[AccountingEntry]) -> None:
    """Add ``entries`` to ``minutes``' sums (:data:`MINUTE_FIELDS`), creating the missing ones. Per
    entry one tuple of what its sums depend on (tenant, model, the minute as a float, the outcome: a
    str member, hashed as its text) and its usage appended to that tuple's list; then per distinct
    tuple :func:`add_usages`. The flush's log writer folds the entries it packs in its own loop instead
    (administration.usage_flush); this is for a batch with no log, or entries beyond it (D116)."""
    groups: dict[tuple[str, str, float, Outcome], list[TokenUsage]] = {}
    known = groups.get
    for entry in entries:
        key = (entry.tenant, entry.model, entry.at // 60.0, entry.outcome)
        usages = known(key)
        if usages is None:
            groups[key] = [entry.usage]
        else:
            usages.append(entry.usage)
    for (tenant, model, minute, outcome), usages in groups.items():
        add_usages(minutes, (tenant, model, int(minute)), outcome is not _SUCCESS, usages)


def add_usages(minutes: dict[MinuteKey, list[int]], key: MinuteKey, errors: bool, usages: list[TokenUsage]) -> None:
    """Add the requests of ``usages`` (one each; errors too when ``errors``) and their counts to
    ``key``'s sums. The counts summed into locals (a slot read and an int add each, specialized by
    the interpreter: ~0.9k instructions a usage under callgrind, where ``sum(map(attrgetter(...)))``
    per count was ~1.4k and a ``sums[i] += n`` per count on the request path ~2.5k)."""
    prompt = completion = cached = reasoning = 0
    for usage in usages:
        prompt += usage.prompt
        completion += usage.completion
        cached += usage.cached
        reasoning += usage.reasoning
    sums = minutes.get(key)
    if sums is None:
        sums = minutes[key] = [0, 0, 0, 0, 0, 0]
    count = len(usages)
    sums[0] += count
    if errors:
        sums[1] += count
    sums[2] += prompt
    sums[3] += completion
    sums[4] += cached
    sums[5] += reasoning


class Drained:
    """One drained batch: ``log`` the request log's rows to write (at most the ledger's capacity, the
    newest), ``minutes`` the sums by (tenant, model, minute) of every request in it. The sums of the
    entries drained since the last fold are made when ``minutes`` is first read (on the flush's
    thread, not on the event loop that drains)."""

    __slots__ = ("_minutes", "log", "_unfolded")

    def __init__(self, minutes: dict[MinuteKey, list[int]] | None = None, log: list[AccountingEntry] | None = None,
                 unfolded: list[AccountingEntry] | None = None) -> None:
        self._minutes = {} if minutes is None else minutes
        self.log = [] if log is None else log
        self._unfolded = unfolded  # entries whose sums are not in _minutes yet

    @property
    def minutes(self) -> dict[MinuteKey, list[int]]:
        unfolded = self._unfolded
        if unfolded:
            self._unfolded = None
            fold_minutes(self._minutes, unfolded)
        return self._minutes

    def claim_log_fold(self) -> bool:
        """True when the log's rows are exactly the entries not folded yet: the caller then adds their
        sums to ``minutes`` itself (the log writer, in the loop that packs the rows) and ``minutes``
        no longer folds them. False otherwise (no log, a log cut to its capacity, or rows put back
        by a refused flush, whose sums are in ``minutes`` already)."""
        if self._unfolded is not None and self._unfolded is self.log:
            self._unfolded = None
            return True
        return False

    def __bool__(self) -> bool:
        return bool(self._minutes or self.log or self._unfolded)

    def __repr__(self) -> str:
        return f"Drained(minutes={self.minutes!r}, log={self.log!r})"


class UsageLedger:
    """Bounded: at most ``log_capacity`` unflushed log rows are kept (the oldest go first when the store
    is away that long); the minute sums grow with distinct (tenant, model, minute) only, and the
    entries not yet folded into them with the requests of one flush interval (at most
    :data:`FOLD_EVERY` before they are folded)."""

    __slots__ = ("_minutes", "_held", "_entries", "log_capacity")

    def __init__(self, log_capacity: int = 100_000) -> None:
        self.log_capacity = log_capacity
        self._minutes: dict[MinuteKey, list[int]] = {}  # folded sums (put back by restore, or folded early)
        self._held: list[AccountingEntry] = []  # log rows whose sums are in _minutes
        self._entries: list[AccountingEntry] = []  # since the last drain, not folded

    def add(self, entry: AccountingEntry) -> None:
        entries = self._entries
        entries.append(entry)
        if len(entries) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """The unfolded entries' sums into ``_minutes``, and the log's rows cut to the capacity."""
        entries, self._entries = self._entries, []
        fold_minutes(self._minutes, entries)
        self._held = self._bounded(self._held + entries)

    def _bounded(self, log: list[AccountingEntry]) -> list[AccountingEntry]:
        capacity = self.log_capacity
        if not capacity:
            return []
        return log if len(log) <= capacity else log[-capacity:]

    def drain(self) -> Drained:
        """Everything added since the last drain, leaving the ledger empty. The new entries' sums are
        folded when the batch's ``minutes`` is read."""
        entries, held = self._entries, self._held
        log = self._bounded(held + entries if held else entries)
        drained = Drained(self._minutes, log, entries)
        self._minutes, self._held, self._entries = {}, [], []
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
        self._held = self._bounded(drained.log + self._held)

    def __len__(self) -> int:
        return len(self._minutes) + len(self._held) + len(self._entries)

"""The in-memory ledger: sums by (tenant, model, minute), the log's rows, drain and restore."""

from __future__ import annotations

import pytest

from inference.accounting import AccountingEntry, Outcome, TokenUsage, UsageLedger
from inference.accounting import ledger as ledger_module


def _entry(at: float, tenant: str = "acme", model: str = "m", outcome: Outcome = Outcome.SUCCESS,
           prompt: int = 10, completion: int = 5) -> AccountingEntry:
    return AccountingEntry(
        at=at, request_id=f"r{at}", tenant=tenant, model=model, worker="http://w", surface="chat",
        route="/v1/chat/completions", status=200 if outcome is Outcome.SUCCESS else 502, outcome=outcome,
        usage=TokenUsage(prompt, completion, cached=2, reasoning=1), latency_secs=0.1,
    )


def test_entries_sum_by_tenant_model_and_minute() -> None:
    ledger = UsageLedger()
    ledger.add(_entry(120.0))
    ledger.add(_entry(179.9, outcome=Outcome.UPSTREAM_ERROR, prompt=3, completion=0))
    ledger.add(_entry(180.0))
    ledger.add(_entry(120.5, tenant="other"))
    drained = ledger.drain()
    assert drained.minutes == {
        ("acme", "m", 2): [2, 1, 13, 5, 4, 2],
        ("acme", "m", 3): [1, 0, 10, 5, 2, 1],
        ("other", "m", 2): [1, 0, 10, 5, 2, 1],
    }
    assert [entry.request_id for entry in drained.log] == ["r120.0", "r179.9", "r180.0", "r120.5"]
    assert not ledger.drain()


def test_a_failed_flush_is_restored_before_what_came_after() -> None:
    ledger = UsageLedger()
    ledger.add(_entry(60.0))
    drained = ledger.drain()
    ledger.add(_entry(61.0))
    ledger.restore(drained)
    again = ledger.drain()
    assert again.minutes == {("acme", "m", 1): [2, 0, 20, 10, 4, 2]}
    assert [entry.request_id for entry in again.log] == ["r60.0", "r61.0"]


def test_the_unflushed_log_is_bounded_and_can_be_off() -> None:
    ledger = UsageLedger(log_capacity=2)
    for second in range(5):
        ledger.add(_entry(float(second)))
    drained = ledger.drain()
    assert [entry.at for entry in drained.log] == [3.0, 4.0]
    assert drained.minutes[("acme", "m", 0)][0] == 5
    off = UsageLedger(log_capacity=0)
    off.add(_entry(1.0))
    assert off.drain().log == []


def _summed_one_by_one(entries: list[AccountingEntry]) -> dict[tuple[str, str, int], list[int]]:
    """The sums as the request path added them before D116: each entry's six sums in turn."""
    minutes: dict[tuple[str, str, int], list[int]] = {}
    for entry in entries:
        sums = minutes.setdefault((entry.tenant, entry.model, int(entry.at // 60)), [0] * 6)
        usage = entry.usage
        for i, n in enumerate((1, int(entry.outcome is not Outcome.SUCCESS), usage.prompt, usage.completion,
                               usage.cached, usage.reasoning)):
            sums[i] += n
    return minutes


def test_the_flush_fold_sums_as_each_entry_added_would() -> None:
    """Tenants, models, outcomes and minutes mixed (times before 1970 and on a minute's edge too): the
    sums folded from a drained batch equal the per-entry sums, and are made when first read."""
    outcomes = list(Outcome)
    entries = [_entry(at, tenant=("acme", "globex")[n % 2], model=("m", "n", "m")[n % 3],
                      outcome=outcomes[n % len(outcomes)], prompt=n, completion=n * 2)
               for n, at in enumerate([-61.0, -60.0, -0.5, 0.0, 59.999, 60.0, 119.0, 1_795_840_099.9] * 7)]
    ledger = UsageLedger()
    for made in entries:
        ledger.add(made)
    drained = ledger.drain()
    assert drained and len(drained.log) == len(entries)
    assert drained.minutes == _summed_one_by_one(entries)


def test_unflushed_entries_past_fold_every_are_folded_and_the_log_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that never comes (a store that hangs) holds bounded memory: past FOLD_EVERY the entries
    become sums and the log keeps its capacity; nothing is lost from the sums."""
    monkeypatch.setattr(ledger_module, "FOLD_EVERY", 4)
    ledger = UsageLedger(log_capacity=3)
    entries = [_entry(float(second * 20)) for second in range(10)]
    for made in entries:
        ledger.add(made)
        assert len(ledger._entries) < 4 and len(ledger._held) <= 3
    drained = ledger.drain()
    assert drained.minutes == _summed_one_by_one(entries)
    assert [entry.at for entry in drained.log] == [140.0, 160.0, 180.0]
    assert not len(ledger)

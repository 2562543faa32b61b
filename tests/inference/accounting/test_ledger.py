"""The in-memory ledger: sums by (tenant, model, minute), the log's rows, drain and restore."""

from __future__ import annotations

from inference.accounting import AccountingEntry, Outcome, TokenUsage, UsageLedger


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

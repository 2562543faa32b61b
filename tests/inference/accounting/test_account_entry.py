"""The entry an account closes into (inference.kit.account, D101): built on a bare instance of
AccountingEntry, every field set, the same entry the class's constructor makes of the same facts."""

from __future__ import annotations

from dataclasses import astuple
from time import perf_counter

from common.config import GatewayConfig
from inference.accounting import OPEN_SCOPE, AccountingEntry, Delivered, Outcome, TokenUsage
from inference.auth import Identity, IdentityKind
from inference.dataplane import DataPlane
from inference.kit.account import RequestAccount
from inference.writers import ResponseClock, ResponseWriter
from inference.writers.framing import OPENAI_SSE


async def _send(message: object) -> None:
    return None


def test_a_closed_account_is_the_entry_the_constructor_makes() -> None:
    dp = DataPlane.build(GatewayConfig())
    writer = ResponseWriter(_send, b"req-0123abc", ResponseClock(perf_counter()), OPENAI_SSE)
    account = RequestAccount(dp, Identity(IdentityKind.ANONYMOUS), "/v1/chat/completions", writer)
    account.model, account.worker = "mock-model", "http://127.0.0.1:8000"
    account.answered(200, Delivered(True, TokenUsage(40, 16)))
    account.finish()
    [entry] = dp.ledger.drain().log
    assert type(entry) is AccountingEntry and type(entry.request_id) is str
    assert entry == AccountingEntry(
        entry.at, "req-0123abc", OPEN_SCOPE, "mock-model", "http://127.0.0.1:8000", "chat", "/v1/chat/completions",
        200, Outcome.SUCCESS, "", TokenUsage(40, 16), entry.latency_secs, None,
    )
    assert len(astuple(entry)) == 13 and entry.latency_secs > 0
    account.close()  # once only
    assert not dp.ledger.drain().log

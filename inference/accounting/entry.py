"""What one inference request used and how it ended, as the turn runner records it: the unit of
accounting (usage per tenant and model, the request log, token budgets). Built once per request, at
its end, from facts the request already holds; nothing here touches the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["Outcome", "TokenUsage", "EstimatedUsage", "AccountingEntry", "SHARED_SCOPE", "OPEN_SCOPE"]

# The tenant column of a request made with the shared --api-key, or with no key configured at all. A
# tenant id never holds ':' (the --tenant-api-key syntax), so neither can collide with one.
SHARED_SCOPE = ":shared"
OPEN_SCOPE = ":open"


class Outcome(StrEnum):
    SUCCESS = "success"
    CLIENT_ERROR = "client_error"  # the request was refused as invalid (a 4xx, the worker's or ours)
    UPSTREAM_ERROR = "upstream_error"  # no worker answered it well (5xx, broken stream, timeout)
    REJECTED = "rejected"  # turned away before any worker: admission, rate limit, budget, no worker
    CANCELLED = "cancelled"  # the client went away first

    @property
    def label(self) -> str:
        return self.value.replace("_", " ").capitalize()


@dataclass(slots=True)
class TokenUsage:
    """Token counts as the answer reported them (zero where it said nothing)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    reasoning: int = 0

    def add(self, other: TokenUsage) -> None:
        self.prompt += other.prompt
        self.completion += other.completion
        self.cached += other.cached
        self.reasoning += other.reasoning

    @property
    def total(self) -> int:
        """What a token budget counts: prompt plus completion."""
        return self.prompt + self.completion


@dataclass(slots=True)
class EstimatedUsage(TokenUsage):
    """Counts the gateway estimated because the answer never reported its own: a relayed stream
    that ended before the worker's usage came (the client left, the worker broke off) or that
    carried none (docs/DECISIONS.md D80). Budgets charge it as any usage; the request log marks the
    row as estimated. A type of its own, so the reported path pays nothing for the mark."""


@dataclass(slots=True)
class AccountingEntry:
    """One inference request, as accounted: never its body, headers or keys. Not frozen: a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, a third of an account's
    cost per request; nothing changes an entry once built."""

    at: float  # Unix seconds when it arrived
    request_id: str
    tenant: str  # a tenant id, SHARED_SCOPE or OPEN_SCOPE
    model: str  # the canonical model id ("" when the request named none that resolved)
    worker: str  # the URL of the worker that answered, "" when none did
    surface: str  # chat, completions, responses, messages, generate, ...
    route: str  # the path, as metrics name it
    status: int
    outcome: Outcome
    error_code: str = ""
    usage: TokenUsage = field(default_factory=TokenUsage)
    latency_secs: float = 0.0
    ttft_secs: float | None = None

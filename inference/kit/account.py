"""The accounting of one inference request (docs/DECISIONS.md D66): made by the route that runs it
once its caller is known, told by the attempts loop which worker answered and what the answer reported
(the :class:`~inference.accounting.Delivered` every ``forward`` returns), and closed exactly once at
the request's end into one :class:`~inference.accounting.AccountingEntry` for the data plane's ledger
(:meth:`DataPlane.account`) and the token counters on /metrics. No I/O: a few attribute writes per
request, and one list append in the ledger (its sums are folded at the flush: D116).

A request's later model turns (Responses tool rounds, the Messages MCP loop) are summed by the surface
that runs them into the one answer it hands back; a background run's request is closed by the run
when it ends (:attr:`Delivered.later`), not by the route that answered the queued object.
"""

from __future__ import annotations

import time
from time import perf_counter

from common import telemetry
from inference.accounting import OPEN_SCOPE, SHARED_SCOPE, AccountingEntry, Delivered, Outcome, TokenUsage
from inference.auth import Identity, IdentityKind
from inference.dataplane import DataPlane
from inference.errors import GatewayError
from inference.writers import ResponseWriter

__all__ = ["RequestAccount", "surface_of", "tenant_of", "CLIENT_CLOSED"]

CLIENT_CLOSED = 499  # the status a request the client left is logged with (no response was finished)
_SUCCESS = Outcome.SUCCESS  # a member read through its enum class is a descriptor call (D85)
_new = object.__new__

_SURFACES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/generate": "generate",
}


def surface_of(path: str) -> str:
    """The surface a route belongs to: chat, completions, responses, messages, generate, or the
    route's last segment (embeddings, rerank, tokenize, ...)."""
    return _SURFACES.get(path) or path.rstrip("/").rsplit("/", 1)[-1]


_TENANT, _SHARED = IdentityKind.TENANT, IdentityKind.SHARED


def tenant_of(identity: Identity) -> str:
    kind = identity.kind
    if kind is _TENANT and identity.tenant_id:
        return identity.tenant_id
    return SHARED_SCOPE if kind is _SHARED else OPEN_SCOPE


class RequestAccount:
    """One request's accounting, open until :meth:`close` (which only the first call does)."""

    __slots__ = (
        "dp", "at", "started", "request_id", "tenant", "surface", "route", "model", "worker", "status",
        "clean", "usage", "writer", "timer", "handed_on", "closed",
    )  # fmt: skip

    def __init__(
        self, dp: DataPlane, identity: Identity, route: str, writer: ResponseWriter,
        timer: telemetry.RouteTimer | None = None,
    ) -> None:  # fmt: skip
        self.dp = dp
        self.started = started = writer.clock.started  # perf_counter() when the request arrived
        self.at = time.time() - (perf_counter() - started)
        self.request_id = writer.request_id
        self.tenant = tenant_of(identity)
        self.surface = surface_of(route)
        self.route = route
        self.model = ""  # the canonical model, once routing resolved it
        self.worker = ""  # the worker of the latest attempt
        self.status = 0  # the status of the answer handed to the client (0: none was)
        self.clean = True
        self.usage: TokenUsage | None = None
        self.writer = writer  # the response: a stream's first chunk is its time to first token
        self.timer = timer
        self.handed_on = False  # a background run closes it when it ends
        self.closed = False

    def answered(self, status: int, delivered: Delivered) -> None:
        """The answer of the current attempt went to the client: what it came to."""
        if delivered.later:
            self.handed_on = True
            return
        self.status = status
        self.clean = delivered.clean
        usage = delivered.usage
        if usage is not None:
            if self.usage is None:
                self.usage = usage  # each answer reports a usage of its own: kept, not copied
            else:
                self.usage = TokenUsage(
                    self.usage.prompt + usage.prompt, self.usage.completion + usage.completion,
                    self.usage.cached + usage.cached, self.usage.reasoning + usage.reasoning,
                )

    def hand_on(self) -> None:
        """The request goes on in a background run, which closes it (``by_run``) when it ends;
        whatever happens to the route's own answer from here on (the client leaving a streamed
        run's feed) is not the request's end."""
        self.handed_on = True

    def close(self, error: GatewayError | None = None, *, cancelled: bool = False, by_run: bool = False) -> None:
        """The request ended: with the answer :meth:`answered` recorded, with ``error`` (the error
        response it got), or ``cancelled`` (the client left first). Once handed on, only the run's
        own close (``by_run``) counts."""
        if self.closed or (self.handed_on and not by_run):
            return
        self.closed = True
        now = perf_counter()
        code = ""
        if cancelled:
            status, outcome = CLIENT_CLOSED, Outcome.CANCELLED
        elif error is not None:
            status, code = error.status, str(error.code)
            if status < 500 and status != 429:
                outcome = Outcome.CLIENT_ERROR
            elif self.worker and status != 429:
                outcome = Outcome.UPSTREAM_ERROR
            else:  # turned away before any worker: rate limit, admission, budget, no worker
                outcome = Outcome.REJECTED
        else:
            status = self.status
            if status >= 500 or not self.clean:
                outcome = Outcome.UPSTREAM_ERROR
                code = "" if self.clean else "stream_failed"
            elif status >= 400:
                outcome = Outcome.CLIENT_ERROR
            else:
                outcome = _SUCCESS
        usage = self.usage
        if usage is None:
            # The client left mid-answer, or the upstream broke off before it reported its usage.
            so_far = self.writer.usage_so_far if cancelled or not self.clean else None
            usage = so_far() if so_far is not None else TokenUsage()
        first_at = 0.0 if self.handed_on else self.writer.first_at
        started = self.started
        # Every field set on a bare instance (the class has slots): calling the class cost the close a
        # third of its instructions more (its __init__'s frame and thirteen arguments, D101), positional
        # thirteen keywords as much again (D85). The request id is printable ASCII (made in hex, or a
        # client's checked token: asgi_io), so the default decoding is its text.
        entry = _new(AccountingEntry)
        entry.at = self.at
        entry.request_id = self.request_id.decode()
        entry.tenant = self.tenant
        entry.model = self.model
        entry.worker = self.worker
        entry.surface = self.surface
        entry.route = self.route
        entry.status = status
        entry.outcome = outcome
        entry.error_code = code
        entry.usage = usage
        entry.latency_secs = now - started
        entry.ttft_secs = first_at - started if first_at else None
        dp = self.dp
        dp.account(entry)
        if usage.prompt or usage.completion or usage.cached or usage.reasoning:
            # The token counters on /metrics, folded in off the request path (telemetry.fold_tokens, D96).
            telemetry.note_tokens(
                (self.timer, self.model, self.tenant if dp.config.usage_metrics_tenant_label else "", usage)
            )

    # The route answered: close, unless the request goes on in a background run (which close itself
    # tells). The same function: a method that only called close was a frame more per request (D101).
    finish = close

"""The request kit's span hooks (``--enable-trace``, :mod:`common.tracing`, docs/DECISIONS.md D74),
used only when tracing is on: the route checks :data:`common.tracing.ENABLED` once and, off, takes
none of these."""

from __future__ import annotations

from types import TracebackType
from typing import Callable, TypeVar, cast

from common import tracing
from inference.accounting import TokenUsage
from inference.admission import Admission
from inference.errors import GatewayError
from inference.routing.selection import RoutingDecision

__all__ = ["TracedAdmission", "selected", "close_request"]

T = TypeVar("T")


class TracedAdmission:
    """:class:`Admission` with an ``admission`` span over the wait for its permit and media budget
    (ended once admitted, or refused with the refusal's status and code)."""

    __slots__ = ("_admission",)

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    async def __aenter__(self) -> None:
        span = tracing.child("admission")
        try:
            await self._admission.__aenter__()
        except GatewayError as refused:
            tracing.fail(span, str(refused.code), refused.message)
            tracing.end(span, refused.status)
            raise
        except BaseException:
            span.end()
            raise
        span.end()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self._admission.__aexit__(kind, error, trace)


_SELECT = tracing.shape("select_worker")
_SELECTED = tracing.Closing("gateway.policy", "gateway.worker.url")  # by (policy, URL): made once (D98)
_CLOSED = tracing.Closing(
    "gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "http.response.status_code"
)  # the request span's closing attributes, by their values (None: not set), made once (D98)


def selected(choose: Callable[[], T], model: str | None) -> T:
    """``choose()`` (the worker selection, or a PD pair's) under a ``select_worker`` span naming the
    policy and the worker it chose. The request's model is its request span's and the worker's id
    its attempt span's: not repeated here (D89)."""
    span = tracing.start(_SELECT)
    try:
        decision = choose()
    except GatewayError as refused:
        tracing.fail(span, str(refused.code), refused.message)
        tracing.end(span, refused.status)
        raise
    if type(decision) is RoutingDecision:  # the usual: its attributes read directly, not by getattr
        chosen = cast(RoutingDecision, decision)
        tracing.end_as(span, _SELECTED, (chosen.policy or None, chosen.worker.record.url))
        return decision
    policy = getattr(decision, "policy", None)
    worker = getattr(decision, "worker", None) or getattr(getattr(decision, "decode", None), "handle", None)
    record = getattr(worker, "record", None)
    if record is not None or policy:
        tracing.end_as(span, _SELECTED, (policy or None, record.url if record is not None else None))
    else:
        span.end()
    return decision


def close_request(
    span: tracing.Span, status: int, model: str, usage: TokenUsage | None, error: GatewayError | None = None,
) -> None:
    """End the request's span with what the request came to (GenAI usage and model, the status)."""
    if error is not None:
        tracing.fail(span, str(error.code), error.message)
    if usage is not None:
        tracing.end_as(span, _CLOSED, (model or None, usage.prompt, usage.completion, status or None), status)
    else:
        tracing.end_as(span, _CLOSED, (model or None, None, None, status or None), status)

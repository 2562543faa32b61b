"""The request kit's span hooks (``--enable-trace``, :mod:`common.tracing`, docs/DECISIONS.md D74),
used only when tracing is on: the route checks :data:`common.tracing.ENABLED` once and, off, takes
none of these."""

from __future__ import annotations

from types import TracebackType
from typing import Callable, TypeVar

from common import tracing
from inference.accounting import TokenUsage
from inference.admission import Admission
from inference.errors import GatewayError

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
    policy = getattr(decision, "policy", None)
    worker = getattr(decision, "worker", None) or getattr(getattr(decision, "decode", None), "handle", None)
    record = getattr(worker, "record", None)
    if record is not None:
        tracing.end(span, None, {"gateway.policy": policy, "gateway.worker.url": record.url} if policy else
                    {"gateway.worker.url": record.url})  # fmt: skip
    else:
        tracing.end(span, None, {"gateway.policy": policy} if policy else None)
    return decision


def close_request(
    span: tracing.Span, status: int, model: str, usage: TokenUsage | None, error: GatewayError | None = None,
) -> None:
    """End the request's span with what the request came to (GenAI usage and model, the status)."""
    if error is not None:
        tracing.fail(span, str(error.code), error.message)
    if usage is not None:
        tracing.end(span, status, {
            "gen_ai.response.model": model, "gen_ai.usage.input_tokens": usage.prompt,
            "gen_ai.usage.output_tokens": usage.completion,
        } if model else {"gen_ai.usage.input_tokens": usage.prompt, "gen_ai.usage.output_tokens": usage.completion})
    else:
        tracing.end(span, status, {"gen_ai.response.model": model} if model else None)

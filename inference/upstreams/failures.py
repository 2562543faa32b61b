"""What goes wrong with an upstream before anything reached the client, in one type every upstream
(relay or engine client) raises, so the attempts loop can count it and retry elsewhere.

One failure is not the worker's: a ``rejected`` one, the worker refusing the request itself as
invalid (an engine's INVALID_ARGUMENT or OUT_OF_RANGE). Its kind is BROKEN (the worker answered, but
not with a result: a probe refused so is a worker that cannot be registered), and it is the
client's error: answered 400, never retried on another worker (any worker would refuse it too),
never counted against the worker's breaker."""

from __future__ import annotations

from enum import StrEnum

from inference import errors
from inference.errors import GatewayError

__all__ = ["EngineEndedWithError", "FailureKind", "UpstreamFailure"]


class FailureKind(StrEnum):
    CONNECT = "connect"  # could not reach the worker, or the request could not be written
    TIMEOUT = "timeout"  # the whole exchange outlived --request-timeout-secs
    BROKEN = "broken"  # the worker broke off before its answer was complete


class UpstreamFailure(Exception):
    """The worker could not be reached, timed out, or broke off before anything reached the client;
    or (``rejected``) it refused the request as invalid."""

    def __init__(self, kind: FailureKind, detail: str, timeout_secs: float = 0.0, *, rejected: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.timeout_secs = timeout_secs
        self.rejected = rejected  # the worker refused the request as invalid: the client's error

    @classmethod
    def refused(cls, detail: str) -> UpstreamFailure:
        """The worker refused the request as invalid (see the module's docstring)."""
        return cls(FailureKind.BROKEN, detail, rejected=True)

    def broke_off(self) -> UpstreamFailure:
        """This failure once the answer started: the worker broke off, whatever it said."""
        self.kind = FailureKind.BROKEN
        self.rejected = False
        return self

    @property
    def timed_out(self) -> bool:
        return self.kind is FailureKind.TIMEOUT

    def to_error(self) -> GatewayError:
        """The client's answer when no other worker can take the request: 504 or 502; 400 for a
        request the worker refused as invalid."""
        if self.rejected:
            return errors.worker_refused(self.detail)
        if self.kind is FailureKind.TIMEOUT:
            return errors.upstream_timeout(self.timeout_secs)
        return errors.upstream_unavailable(self.detail)

    def in_band(self) -> GatewayError:
        """The error reported inside a response that already started."""
        return errors.stream_failed(self.detail)


class EngineEndedWithError(UpstreamFailure):
    """An engine ended the request itself with finish reason ``error``: an answer, not a transport
    failure. vLLM ends so a request whose KV load failed under ``kv_load_failure_policy: fail`` (how
    a vLLM decode engine reports a failed PD KV transfer)."""

    def __init__(self, detail: str) -> None:
        super().__init__(FailureKind.BROKEN, detail)

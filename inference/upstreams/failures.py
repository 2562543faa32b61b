"""What goes wrong with an upstream before anything reached the client, in one type every upstream
(relay or engine client) raises, so the attempts loop can count it and retry elsewhere."""

from __future__ import annotations

from enum import StrEnum

from inference import errors
from inference.errors import GatewayError

__all__ = ["FailureKind", "UpstreamFailure"]


class FailureKind(StrEnum):
    CONNECT = "connect"  # could not reach the worker, or the request could not be written
    TIMEOUT = "timeout"  # the whole exchange outlived --request-timeout-secs
    BROKEN = "broken"  # the worker broke off before its answer was complete


class UpstreamFailure(Exception):
    """The worker could not be reached, timed out, or broke off before anything reached the client."""

    def __init__(self, kind: FailureKind, detail: str, timeout_secs: float = 0.0) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.timeout_secs = timeout_secs

    @property
    def timed_out(self) -> bool:
        return self.kind is FailureKind.TIMEOUT

    def to_error(self) -> GatewayError:
        """The client's answer when no other worker can take the request: 504 or 502."""
        if self.kind is FailureKind.TIMEOUT:
            return errors.upstream_timeout(self.timeout_secs)
        return errors.upstream_unavailable(self.detail)

    def in_band(self) -> GatewayError:
        """The error reported inside a response that already started."""
        return errors.stream_failed(self.detail)

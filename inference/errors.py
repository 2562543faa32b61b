"""The one error builder for every response the gateway makes itself (spec 1, Errors).

Standard envelope: ``{"error": {"message", "type", "param", "code"}}`` plus the header
``X-GW-Error-Code`` repeating ``code``. Raise :class:`GatewayError` anywhere on the data plane; a
renderer per surface turns it into bytes: :func:`render_json` (an HTTP error response, every surface
before its response started) here, the in-band stream errors with each surface's framing
(inference.writers).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

import orjson

__all__ = [
    "ErrorCode",
    "GatewayError",
    "error_body",
    "error_headers",
    "render_json",
    "unauthorized",
    "stream_failed",
    "invalid_request",
    "json_parse_error",
    "model_not_found",
    "no_healthy_workers",
    "payload_too_large",
    "endpoint_not_found",
    "method_not_allowed",
    "upstream_unavailable",
    "upstream_timeout",
    "worker_refused",
    "internal_error",
    "admission_queue_full",
    "admission_queue_timeout",
    "rate_limit_exceeded",
    "budget_exceeded",
    "multimodal_payload_too_large",
    "multimodal_inflight_budget",
    "worker_overload_shed",
    "endpoint_not_supported",
    "request_head_too_large",
    "request_timeout",
    "tokenizer_not_ready",
    "tokenizer_not_found",
    "context_length_exceeded",
    "tokenization_failed",
    "parse_error",
    "no_prefill_servers",
    "prefill_failed",
]

# Error type per status where the spec names one; other statuses use the snake-cased status text.
_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "method_not_allowed",
    408: "timeout_error",
    413: "payload_too_large",
    431: "request_header_fields_too_large",
    429: "rate_limit_error",
    500: "internal_error",
    501: "not_implemented",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


class ErrorCode(str, Enum):
    """String error codes of the data plane. Validation failures use the numeric code 400 instead."""

    JSON_PARSE_ERROR = "json_parse_error"
    MODEL_NOT_FOUND = "model_not_found"
    NO_HEALTHY_WORKERS = "no_healthy_workers"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    ENDPOINT_NOT_FOUND = "endpoint_not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    INTERNAL_ERROR = "internal_error"
    ADMISSION_QUEUE_FULL = "admission_queue_full"
    ADMISSION_QUEUE_TIMEOUT = "admission_queue_timeout"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"
    MULTIMODAL_PAYLOAD_TOO_LARGE = "multimodal_payload_too_large"
    MULTIMODAL_INFLIGHT_BUDGET = "multimodal_inflight_budget"
    WORKER_OVERLOAD_SHED = "worker_overload_protection_shed"
    ENDPOINT_NOT_SUPPORTED = "endpoint_not_supported"
    UNAUTHORIZED = "unauthorized"
    REQUEST_HEAD_TOO_LARGE = "request_header_fields_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    TOKENIZER_NOT_READY = "tokenizer_not_ready"
    TOKENIZER_NOT_FOUND = "tokenizer_not_found"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    TOKENIZATION_FAILED = "tokenization_failed"
    PARSE_ERROR = "parse_error"
    MCP_CONNECTION_FAILED = "mcp_connection_failed"
    MCP_MAX_ITERATIONS = "mcp_max_iterations"
    NO_PREFILL_SERVERS = "no_prefill_servers"
    MULTIMODAL_NOT_SUPPORTED = "multimodal_not_supported"


class GatewayError(Exception):
    """An error the gateway answers itself, with the spec's status, type and code."""

    __slots__ = ("status", "code", "message", "param", "error_type", "headers", "empty_body")

    def __init__(
        self,
        status: int,
        code: str | int | ErrorCode,
        message: str,
        *,
        param: str | None = None,
        error_type: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        empty_body: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code: str | int = code.value if isinstance(code, ErrorCode) else code
        self.message = message
        self.param = param
        self.error_type = error_type or _TYPE_BY_STATUS.get(status, "error")
        self.headers = headers
        self.empty_body = empty_body  # answered with no body and no X-GW-Error-Code (401)

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_body(error: GatewayError) -> bytes:
    return orjson.dumps(error.to_dict())


def error_headers(error: GatewayError) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", b"application/json"),
        (b"x-gw-error-code", str(error.code).encode()),
    ]
    headers.extend(error.headers)
    return headers


def render_json(error: GatewayError, request_id: bytes | None = None) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """An error as an HTTP response: its headers and body (the standard envelope, or nothing)."""
    if error.empty_body:
        headers = [(b"content-length", b"0")]
        body = b""
    else:
        headers = error_headers(error)
        body = error_body(error)
    if request_id is not None:
        headers.append((b"x-request-id", request_id))
    return headers, body


def unauthorized() -> GatewayError:
    """401 with an empty body for a missing or unknown key (spec 1, Authentication)."""
    return GatewayError(401, ErrorCode.UNAUTHORIZED, "Missing or unknown API key", empty_body=True)


def stream_failed(detail: str) -> GatewayError:
    """A worker or engine stream that failed after the response started: reported in-band."""
    return GatewayError(500, ErrorCode.INTERNAL_ERROR, f"Worker stream failed: {detail}")


def invalid_request(message: str, param: str | None = None) -> GatewayError:
    """A validation failure: 400, type invalid_request_error, numeric code 400."""
    return GatewayError(400, 400, message, param=param)


def json_parse_error(message: str) -> GatewayError:
    return GatewayError(400, ErrorCode.JSON_PARSE_ERROR, message)


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404, ErrorCode.MODEL_NOT_FOUND, f"The model '{model}' does not exist", param="model"
    )


def no_healthy_workers(model: str | None) -> GatewayError:
    target = f"model '{model}'" if model else "this request"
    return GatewayError(503, ErrorCode.NO_HEALTHY_WORKERS, f"No healthy worker available for {target}")


def payload_too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, ErrorCode.PAYLOAD_TOO_LARGE, f"Request body exceeds the maximum payload size of {limit} bytes"
    )


def endpoint_not_found(path: str) -> GatewayError:
    return GatewayError(404, ErrorCode.ENDPOINT_NOT_FOUND, f"No route for {path}")


def method_not_allowed(method: str, path: str, allowed: str) -> GatewayError:
    return GatewayError(
        405,
        ErrorCode.METHOD_NOT_ALLOWED,
        f"Method {method} is not allowed on {path}",
        headers=((b"allow", allowed.encode()),),
    )


def upstream_unavailable(detail: str) -> GatewayError:
    return GatewayError(502, ErrorCode.UPSTREAM_UNAVAILABLE, f"Worker request failed: {detail}")


def upstream_timeout(seconds: float) -> GatewayError:
    return GatewayError(504, ErrorCode.UPSTREAM_TIMEOUT, f"Worker did not answer within {seconds:g} seconds")


def worker_refused(detail: str) -> GatewayError:
    """400 when the worker refused the request as invalid (an engine's INVALID_ARGUMENT or
    OUT_OF_RANGE): a validation failure, so code 400 (numeric), as the gateway's own checks answer."""
    return GatewayError(400, 400, f"The worker refused the request as invalid: {detail}")


def internal_error(message: str = "Internal server error") -> GatewayError:
    return GatewayError(500, ErrorCode.INTERNAL_ERROR, message)



def admission_queue_full() -> GatewayError:
    return GatewayError(429, ErrorCode.ADMISSION_QUEUE_FULL, "Too many requests: the admission queue is full")


def admission_queue_timeout(seconds: float) -> GatewayError:
    return GatewayError(
        503, ErrorCode.ADMISSION_QUEUE_TIMEOUT, f"Request waited more than {seconds:g} seconds in the admission queue"
    )


def rate_limit_exceeded(headers: tuple[tuple[bytes, bytes], ...]) -> GatewayError:
    """429 for a tenant over its requests-per-minute budget; ``headers`` carry Retry-After and X-RateLimit-*."""
    return GatewayError(429, ErrorCode.RATE_LIMIT_EXCEEDED, "Rate limit exceeded for this API key", headers=headers)


def budget_exceeded(period: str, retry_after_secs: int) -> GatewayError:
    """429 for a tenant whose token budget of this ``period`` (day or month) is used up; Retry-After
    is the seconds to the period's end (inference/admission/budgets.py)."""
    return GatewayError(
        429,
        ErrorCode.BUDGET_EXCEEDED,
        f"Token budget exceeded for this API key's tenant: no tokens left this {period} (UTC)",
        headers=((b"retry-after", str(retry_after_secs).encode()),),
    )


def multimodal_payload_too_large(size: int, limit: int) -> GatewayError:
    return GatewayError(
        413,
        ErrorCode.MULTIMODAL_PAYLOAD_TOO_LARGE,
        f"Inline media of about {size} bytes exceeds the in-flight media budget of {limit} bytes",
    )


def multimodal_inflight_budget() -> GatewayError:
    return GatewayError(
        429, ErrorCode.MULTIMODAL_INFLIGHT_BUDGET, "Too many requests: the in-flight media budget is full"
    )


def worker_overload_shed(retry_after_secs: float) -> GatewayError:
    """503 when every worker that could take the request is overloaded; Retry-After is the time until
    the next load report (the load-monitor interval), rounded up to whole seconds. Not retried."""
    retry_after = max(1, math.ceil(retry_after_secs))
    return GatewayError(
        503,
        ErrorCode.WORKER_OVERLOAD_SHED,
        "All workers for this request are overloaded; retry later",
        headers=((b"retry-after", str(retry_after).encode()),),
    )


def endpoint_not_supported(path: str, transports: str) -> GatewayError:
    """501 when the chosen kind of worker (``transports``: "grpc", "tokenspeed gRPC", ...) cannot
    serve ``path``: the spec's "backend does not serve the endpoint"."""
    return GatewayError(
        501,
        ErrorCode.ENDPOINT_NOT_SUPPORTED,
        f"{path} is not served by {transports} workers",
    )


def request_head_too_large(max_bytes: int, max_headers: int) -> GatewayError:
    """A request head past --max-request-head-bytes or --max-request-headers (answered, then closed)."""
    return GatewayError(
        431,
        ErrorCode.REQUEST_HEAD_TOO_LARGE,
        f"Request head exceeds {max_bytes} bytes or {max_headers} header fields",
    )


def request_timeout(part: str, seconds: float) -> GatewayError:
    """A request head or body that did not arrive in time (answered, then closed)."""
    return GatewayError(408, ErrorCode.REQUEST_TIMEOUT, f"The {part} did not arrive within {seconds:g} seconds")


def tokenizer_not_ready(model: str) -> GatewayError:
    """503 while the model's tokenizer loads in this process (spec 1: Retry-After: 1)."""
    return GatewayError(
        503,
        ErrorCode.TOKENIZER_NOT_READY,
        f"The tokenizer for model '{model}' is loading; retry shortly",
        headers=((b"retry-after", b"1"),),
    )


def tokenizer_not_found(model: str, detail: str | None = None) -> GatewayError:
    """500 when no tokenizer can serve ``model``: none registered or configured under
    --disable-tokenizer-autoload, or its load failed (``detail``)."""
    message = f"No tokenizer is available for model '{model}'"
    return GatewayError(500, ErrorCode.TOKENIZER_NOT_FOUND, f"{message}: {detail}" if detail else message)


def context_length_exceeded(prompt_tokens: int, context_length: int) -> GatewayError:
    """400 when the prompt does not fit the model's context window (spec 1: param null)."""
    return GatewayError(
        400,
        ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        f"This model's maximum context length is {context_length} tokens; the prompt has {prompt_tokens} tokens",
        param=None,
    )


def tokenization_failed(detail: str) -> GatewayError:
    """500 when the model's tokenizer fails on a prompt."""
    return GatewayError(500, ErrorCode.TOKENIZATION_FAILED, f"Tokenization failed: {detail}")


def parse_error(detail: str) -> GatewayError:
    """502 when an upstream's success answer does not parse as the surface's schema (spec 1: an
    external provider's whole Messages answer)."""
    return GatewayError(502, ErrorCode.PARSE_ERROR, f"The upstream's answer does not parse: {detail}")


def mcp_connection_failed(detail: str) -> GatewayError:
    """502 when none of a Messages request's MCP servers connects (spec 1, MCP tool loop)."""
    return GatewayError(502, ErrorCode.MCP_CONNECTION_FAILED, f"No MCP server could be connected: {detail}")


def mcp_max_iterations(rounds: int) -> GatewayError:
    """502 when the model still calls MCP tools after the tool loop's last round (spec 1, Limits)."""
    return GatewayError(
        502, ErrorCode.MCP_MAX_ITERATIONS, f"The model was still calling MCP tools after {rounds} rounds of the tool loop"
    )


def no_prefill_servers() -> GatewayError:
    """PD: no prefill worker can take the request (spec 1, 503 service_unavailable)."""
    return GatewayError(503, ErrorCode.NO_PREFILL_SERVERS, "No prefill servers available")


def no_encode_servers(model: str | None) -> GatewayError:
    """EPD: no encode worker can take a request's images (spec 1's 503 no_healthy_workers; the spec
    names no code of its own for the encode side)."""
    target = f"model '{model}'" if model else "this request"
    return GatewayError(503, ErrorCode.NO_HEALTHY_WORKERS, f"No encode worker available for {target}")


def multimodal_not_supported(message: str) -> GatewayError:
    """400 multimodal_not_supported: media the chosen path cannot take."""
    return GatewayError(400, ErrorCode.MULTIMODAL_NOT_SUPPORTED, message)


# A prefill worker's error status, as the client sees it (the reference gateway's mapping).
_PREFILL_CODES: dict[int, tuple[int, str]] = {
    400: (400, "prefill_bad_request"),
    404: (404, "prefill_not_found"),
    500: (500, "prefill_internal_error"),
    502: (502, "prefill_bad_gateway"),
    503: (503, "prefill_unavailable"),
}


def prefill_failed(status: int, detail: str) -> GatewayError:
    """PD: the prefill worker answered ``status`` (an error) while its decode worker waited."""
    answered, code = _PREFILL_CODES.get(status, (500, "prefill_error"))
    return GatewayError(answered, code, f"Prefill server error ({status}): {detail}")

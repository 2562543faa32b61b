"""Validation of POST /v1/completions (spec 1, "Text completion request").

The chat extension fields apply except continue_final_message, separate_reasoning,
stream_reasoning and chat_template_kwargs; ``json_schema`` is added as a string constraint. Text
completions rewrite nothing, so ``modified`` is always False.
"""

from __future__ import annotations

from typing import Any

from inference.errors import invalid_request
from inference.schemas.base import ValidatedRequest
from inference.schemas.fields import (
    EXTENSION_FIELDS,
    SHARED_FIELDS,
    Checker,
    boolean,
    check_fields,
    check_min_tokens,
    check_model,
    check_output_constraints,
    check_stream_options_allowed,
    integer_at_least,
    integer_between,
    string,
)

__all__ = ["validate_completion"]


_FIELDS: dict[str, Checker] = {
    **SHARED_FIELDS,
    **EXTENSION_FIELDS,
    "max_tokens": integer_at_least(0),
    "n": integer_between(1, 128),
    "best_of": integer_between(0, 20),
    "logprobs": integer_between(0, 5),
    "echo": boolean,
    "suffix": string,
    "seed": integer_at_least(None),
    "json_schema": string,
}


def _check_prompt(prompt: Any) -> None:
    if prompt is None:
        raise invalid_request("prompt is required", "prompt")
    if type(prompt) is str:
        return
    if type(prompt) is not list:
        raise invalid_request("prompt must be a string or an array", "prompt")
    if not prompt:
        raise invalid_request("prompt must not be an empty array", "prompt")


def _check_best_of(body: dict[str, Any]) -> None:
    best_of = body.get("best_of")
    if best_of is None:
        return
    n = body.get("n")
    if n is not None and best_of < n:
        raise invalid_request("best_of must not be less than n", "best_of")
    if body.get("stream") is True:
        raise invalid_request("best_of is not allowed when stream is true", "best_of")


def validate_completion(body: dict[str, Any]) -> ValidatedRequest:
    """Check a text completion body against spec 1. The body is returned untouched."""
    model = check_model(body)
    _check_prompt(body.get("prompt"))

    check_fields(body, _FIELDS)

    check_stream_options_allowed(body)
    _check_best_of(body)
    check_min_tokens(body, "max_tokens")
    json_schema = "json_schema" if body.get("json_schema") is not None else None
    check_output_constraints(body, json_schema)
    return ValidatedRequest(body=body, model=model, stream=body.get("stream") is True, modified=False)

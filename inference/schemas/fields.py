"""Field checkers shared by chat and text completion validation (spec 1).

Each rule lives here once. A *checker* is a callable ``check(value, param)`` that raises
:func:`~inference.errors.invalid_request` naming ``param``; the validators keep one table
``field name -> checker`` and call the checker only for keys present with a non-null value
(JSON null means "unset" for every optional field).

Types are checked with ``type(x) is ...`` on purpose: bodies come from a JSON parser, ``bool`` is not
accepted where an integer or a number is wanted, and an integer field given as ``5.0`` is rejected.
Values are never converted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from inference.errors import invalid_request

__all__ = [
    "Checker",
    "check_model",
    "check_fields",
    "SHARED_FIELDS",
    "EXTENSION_FIELDS",
    "CHAT_EXTENSION_FIELDS",
    "is_number",
    "number_between",
    "number_above_at_most",
    "integer_between",
    "integer_at_least",
    "top_k_value",
    "boolean",
    "string",
    "json_object",
    "integer_array",
    "check_stop",
    "check_stream_options",
    "check_stream_options_allowed",
    "check_min_tokens",
    "check_output_constraints",
]

Checker = Callable[[Any, str], None]


def is_number(value: Any) -> bool:
    """An int or a float, never a bool."""
    kind = type(value)
    return kind is int or kind is float


def _fmt(bound: float) -> str:
    return f"{bound:g}"


def number_between(low: float, high: float) -> Checker:
    """A number with ``low <= value <= high`` (NaN fails the range)."""
    message = f"must be between {_fmt(low)} and {_fmt(high)}"

    def check(value: Any, param: str) -> None:
        kind = type(value)
        if kind is not float and kind is not int:
            raise invalid_request(f"{param} must be a number", param)
        if not low <= value <= high:
            raise invalid_request(f"{param} {message}", param)

    return check


def number_above_at_most(low: float, high: float) -> Checker:
    """A number with ``low < value <= high`` (top_p)."""
    message = f"must be greater than {_fmt(low)} and at most {_fmt(high)}"

    def check(value: Any, param: str) -> None:
        kind = type(value)
        if kind is not float and kind is not int:
            raise invalid_request(f"{param} must be a number", param)
        if not low < value <= high:
            raise invalid_request(f"{param} {message}", param)

    return check


def integer_between(low: int, high: int) -> Checker:
    message = f"must be between {low} and {high}"

    def check(value: Any, param: str) -> None:
        if type(value) is not int:
            raise invalid_request(f"{param} must be an integer", param)
        if not low <= value <= high:
            raise invalid_request(f"{param} {message}", param)

    return check


def integer_at_least(low: int | None) -> Checker:
    """An integer, at least ``low`` when given (``None``: any integer)."""

    def check(value: Any, param: str) -> None:
        if type(value) is not int:
            raise invalid_request(f"{param} must be an integer", param)
        if low is not None and value < low:
            raise invalid_request(f"{param} must be at least {low}", param)

    return check


def top_k_value(value: Any, param: str) -> None:
    """-1 disables top-k; otherwise at least 1."""
    if type(value) is not int:
        raise invalid_request(f"{param} must be an integer", param)
    if value < 1 and value != -1:
        raise invalid_request(f"{param} must be -1 or at least 1", param)


def boolean(value: Any, param: str) -> None:
    if type(value) is not bool:
        raise invalid_request(f"{param} must be a boolean", param)


def string(value: Any, param: str) -> None:
    if type(value) is not str:
        raise invalid_request(f"{param} must be a string", param)


def json_object(value: Any, param: str) -> None:
    if type(value) is not dict:
        raise invalid_request(f"{param} must be an object", param)


def integer_array(value: Any, param: str) -> None:
    if type(value) is not list:
        raise invalid_request(f"{param} must be an array of integers", param)
    for item in value:
        if type(item) is not int:
            raise invalid_request(f"{param} must be an array of integers", param)


MAX_STOP_SEQUENCES = 4


def check_stop(value: Any, param: str) -> None:
    """A non-empty string, or an array of at most 4 non-empty strings."""
    if type(value) is str:
        if not value:
            raise invalid_request(f"{param} must not be an empty string", param)
        return
    if type(value) is not list:
        raise invalid_request(f"{param} must be a string or an array of strings", param)
    if len(value) > MAX_STOP_SEQUENCES:
        raise invalid_request(f"{param} must have at most {MAX_STOP_SEQUENCES} sequences", param)
    for item in value:
        if type(item) is not str or not item:
            raise invalid_request(f"{param} sequences must be non-empty strings", param)


_STREAM_OPTION_FLAGS = ("include_usage", "continuous_usage_stats")


def check_stream_options(value: Any, param: str) -> None:
    """An object; include_usage and continuous_usage_stats are booleans; other keys are kept."""
    if type(value) is not dict:
        raise invalid_request(f"{param} must be an object", param)
    for key in _STREAM_OPTION_FLAGS:
        flag = value.get(key)
        if flag is not None and type(flag) is not bool:
            raise invalid_request(f"{param}.{key} must be a boolean", f"{param}.{key}")


def check_stream_options_allowed(body: Mapping[str, Any]) -> None:
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise invalid_request("stream_options is only allowed when stream is true", "stream_options")


def check_min_tokens(body: Mapping[str, Any], limit_field: str) -> None:
    """min_tokens must not exceed the request's token limit (chat: after max_tokens migration)."""
    minimum = body.get("min_tokens")
    if minimum is None:
        return
    limit = body.get(limit_field)
    if limit is not None and minimum > limit:
        raise invalid_request(f"min_tokens must not exceed {limit_field}", "min_tokens")


def check_output_constraints(body: Mapping[str, Any], json_constraint: str | None) -> None:
    """At most one output constraint among regex, ebnf and a JSON constraint.

    ``json_constraint`` names the JSON constraint the request sets, or is None: chat passes its JSON
    response_format ("a json_schema response_format", "a json_object response_format"), completions
    the ``json_schema`` string field.
    """
    regex = body.get("regex") is not None
    ebnf = body.get("ebnf") is not None
    if not regex and not ebnf:
        return
    if regex and ebnf:
        raise invalid_request("only one of regex and ebnf may be set", "ebnf")
    name = "regex" if regex else "ebnf"
    if json_constraint is not None:
        raise invalid_request(f"{name} cannot be combined with {json_constraint}", name)


def check_model(body: Any) -> str:
    """The body is a JSON object and names its model with a non-empty string; returns the model."""
    if type(body) is not dict:
        raise invalid_request("request body must be a JSON object")
    model = body.get("model")
    if type(model) is not str or not model:
        if model is None:
            raise invalid_request("model is required", "model")
        raise invalid_request("model must be a non-empty string", "model")
    return model


def check_fields(body: dict[str, Any], table: Mapping[str, Checker]) -> None:
    """Run the table's checker for every field present with a non-null value."""
    for key, value in body.items():
        check = table.get(key)
        if check is not None and value is not None:
            check(value, key)


_number_penalty = number_between(-2, 2)

# Rules that read the same on chat and text completions.
SHARED_FIELDS: dict[str, Checker] = {
    "temperature": number_between(0, 2),
    "top_p": number_above_at_most(0, 1),
    "presence_penalty": _number_penalty,
    "frequency_penalty": _number_penalty,
    "stream": boolean,
    "stream_options": check_stream_options,
    "stop": check_stop,
    "user": string,
}

# Extension fields accepted on both routes (spec 1, "Extension fields").
EXTENSION_FIELDS: dict[str, Checker] = {
    "top_k": top_k_value,
    "min_p": number_between(0, 1),
    "min_tokens": integer_at_least(0),
    "repetition_penalty": number_between(0, 2),
    "regex": string,
    "ebnf": string,
    "stop_token_ids": integer_array,
    "ignore_eos": boolean,
    "no_stop_trim": boolean,
    "skip_special_tokens": boolean,
    "return_hidden_states": boolean,
    "lora_path": string,
    "sampling_seed": integer_at_least(None),
    "rid": string,
}

# Extension fields of chat completions only.
CHAT_EXTENSION_FIELDS: dict[str, Checker] = {
    "continue_final_message": boolean,
    "separate_reasoning": boolean,
    "stream_reasoning": boolean,
    "chat_template_kwargs": json_object,
}

"""Stage "build engine request": a validated chat or completion body's sampling fields as the
engine's :class:`SamplingParams` (spec 1, request fields and extension fields).

Every field goes as sent (min_tokens included); a field the client did not set keeps the neutral
value of :class:`SamplingParams`, which the engine codec sends explicitly (proto3's 0 would mean
greedy). Stop strings stay with the gateway (:mod:`inference.pipeline.stops`), never the engine.
The output constraint comes from ``response_format``, ``regex``, ``ebnf`` or (completions) a
``json_schema`` string, or from a required or named ``tool_choice`` (:func:`tool_constraint`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from inference import errors
from inference.pipeline.tool_choice import ToolChoice
from inference.upstreams.engine import Constraint, ConstraintKind, SamplingParams

__all__ = [
    "chat_sampling", "completion_sampling", "stop_strings", "output_constraint", "format_constraint", "tool_constraint",
]  # fmt: skip


def stop_strings(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    if not value:
        return ()
    pairs = []
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise errors.invalid_request("logit_bias keys must be token IDs", "logit_bias") from None
        pairs.append((token, float(bias)))
    return tuple(pairs)


def format_constraint(response_format: Any) -> Constraint | None:
    """The constraint of a chat ``response_format`` (json_object or json_schema; text: none)."""
    if isinstance(response_format, Mapping):
        kind = response_format.get("type")
        if kind == "json_object":
            return Constraint(ConstraintKind.JSON_OBJECT)
        if kind == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema", {})
            return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema, ensure_ascii=False))
    return None


def tool_constraint(tool_choice: ToolChoice | None) -> Constraint | None:
    """The constraint a required or named tool choice enforces (its calls' JSON schema)."""
    if tool_choice is not None and tool_choice.schema is not None:
        return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(tool_choice.schema, ensure_ascii=False))
    return None


def output_constraint(body: Mapping[str, Any], tool_choice: ToolChoice | None = None) -> Constraint | None:
    """The constraint the request asks for (validation allowed at most one of them)."""
    constraint = tool_constraint(tool_choice) or format_constraint(body.get("response_format"))
    if constraint is not None:
        return constraint
    if isinstance(body.get("regex"), str):
        return Constraint(ConstraintKind.REGEX, body["regex"])
    if isinstance(body.get("ebnf"), str):
        return Constraint(ConstraintKind.GRAMMAR, body["ebnf"])
    if isinstance(body.get("json_schema"), str):  # completions' string constraint
        return Constraint(ConstraintKind.JSON_SCHEMA, body["json_schema"])
    return None


# Body fields that are SamplingParams fields of the same name, passed when set (not null).
_SAME_NAMED = (
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    "skip_special_tokens", "ignore_eos",
)  # fmt: skip


def _common(body: Mapping[str, Any], max_new_tokens: Any, n: int) -> dict[str, Any]:
    """The SamplingParams fields the body sets (a null field keeps its default)."""
    get = body.get
    values: dict[str, Any] = {name: value for name in _SAME_NAMED if (value := get(name)) is not None}
    seed = get("sampling_seed")
    if seed is None:
        seed = get("seed")
    if seed is not None:
        values["seed"] = seed
    if max_new_tokens is not None:
        values["max_new_tokens"] = max_new_tokens
    minimum = get("min_tokens")
    if minimum is not None:
        values["min_new_tokens"] = minimum
    values["stop"] = stop_strings(body)
    values["stop_token_ids"] = tuple(get("stop_token_ids") or ())
    values["n"] = n
    values["logit_bias"] = _logit_bias(get("logit_bias"))
    return values


def chat_sampling(body: Mapping[str, Any], tool_choice: ToolChoice | None = None) -> SamplingParams:
    """The sampling of a validated chat completion body."""
    values = _common(body, body.get("max_completion_tokens"), int(body.get("n") or 1))
    if body.get("logprobs") is True:
        values["logprobs"] = True
        values["top_logprobs"] = int(body.get("top_logprobs") or 0)
    return SamplingParams(**values, constraint=output_constraint(body, tool_choice))


def completion_sampling(body: Mapping[str, Any]) -> SamplingParams:
    """The sampling of one prompt of a validated text completion body (``logprobs`` is the number
    of alternatives per token, 0-5)."""
    values = _common(body, body.get("max_tokens", 16), int(body.get("n") or 1))
    logprobs = body.get("logprobs")
    if logprobs is not None:
        values["logprobs"] = True
        values["top_logprobs"] = int(logprobs)
    return SamplingParams(**values, constraint=output_constraint(body))

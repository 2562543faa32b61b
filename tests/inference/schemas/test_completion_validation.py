"""POST /v1/completions request validation (spec 1, Text completion request). Pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from inference.errors import GatewayError
from inference.schemas.completions import validate_completion

MODEL = "meta-llama/Llama-3.1-8B"


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


def assert_rejected(body: Any, param: str | None, fragment: str) -> None:
    with pytest.raises(GatewayError) as info:
        validate_completion(body)
    error = info.value
    assert error.status == 400
    assert error.code == 400
    assert error.error_type == "invalid_request_error"
    assert error.param == param
    assert fragment in error.message, error.message
    if param is not None:
        assert param.split(".")[0] in error.message


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": ""},
        {"prompt": ["a", "b"]},
        {"prompt": [1, 2, 3]},
        {"prompt": [[1, 2], [3]]},
        {"max_tokens": 0},
        {"max_tokens": 4096},
        {"temperature": 0},
        {"temperature": 2},
        {"top_p": 1},
        {"top_p": 0.001},
        {"n": 1},
        {"n": 128},
        {"best_of": 0},
        {"best_of": 20},
        {"n": 3, "best_of": 3},
        {"n": 1, "best_of": 20},
        {"best_of": 2, "stream": False},
        {"logprobs": 0},
        {"logprobs": 5},
        {"stream": True},
        {"stream": True, "stream_options": {"include_usage": True, "other": 1}},
        {"stop": "\n"},
        {"stop": ["a", "b", "c", "d"]},
        {"echo": True},
        {"suffix": "end"},
        {"presence_penalty": -2},
        {"frequency_penalty": 2},
        {"seed": 42},
        {"seed": -1},
        {"user": "u"},
        {"top_k": -1},
        {"min_p": 1},
        {"min_tokens": 0},
        {"max_tokens": 8, "min_tokens": 8},
        {"min_tokens": 100},
        {"repetition_penalty": 2},
        {"regex": "[0-9]+"},
        {"ebnf": 'root ::= "x"'},
        {"json_schema": '{"type": "object"}'},
        {"stop_token_ids": [2]},
        {"ignore_eos": False},
        {"no_stop_trim": True},
        {"skip_special_tokens": True},
        {"return_hidden_states": False},
        {"lora_path": "a"},
        {"sampling_seed": 3},
        {"rid": "r"},
        {"best_of": None, "n": None, "logprobs": None},
        # chat-only fields are unmodelled here: kept and not checked
        {"continue_final_message": "yes", "chat_template_kwargs": [], "separate_reasoning": 1},
        {"stream_reasoning": "x", "response_format": "anything"},
    ],
)
def test_it_accepts(fields: dict[str, Any]) -> None:
    body = completion(**fields)
    snapshot = dict(body)
    result = validate_completion(body)
    assert result.body is body
    assert body == snapshot
    assert result.modified is False


REJECTED: list[tuple[dict[str, Any], str, str]] = [
    ({"prompt": None}, "prompt", "prompt is required"),
    ({"prompt": []}, "prompt", "must not be an empty array"),
    ({"prompt": 5}, "prompt", "string or an array"),
    ({"prompt": {"text": "x"}}, "prompt", "string or an array"),
    ({"max_tokens": -1}, "max_tokens", "at least 0"),
    ({"max_tokens": 16.0}, "max_tokens", "must be an integer"),
    ({"max_tokens": True}, "max_tokens", "must be an integer"),
    ({"temperature": -0.1}, "temperature", "between 0 and 2"),
    ({"temperature": 2.1}, "temperature", "between 0 and 2"),
    ({"top_p": 0}, "top_p", "greater than 0 and at most 1"),
    ({"top_p": 1.5}, "top_p", "greater than 0 and at most 1"),
    ({"n": 0}, "n", "between 1 and 128"),
    ({"n": 129}, "n", "between 1 and 128"),
    ({"n": 1.0}, "n", "must be an integer"),
    ({"best_of": -1}, "best_of", "between 0 and 20"),
    ({"best_of": 21}, "best_of", "between 0 and 20"),
    ({"best_of": 2.0}, "best_of", "must be an integer"),
    ({"n": 4, "best_of": 3}, "best_of", "must not be less than n"),
    ({"n": 1, "best_of": 0}, "best_of", "must not be less than n"),
    ({"best_of": 2, "stream": True}, "best_of", "not allowed when stream is true"),
    ({"logprobs": -1}, "logprobs", "between 0 and 5"),
    ({"logprobs": 6}, "logprobs", "between 0 and 5"),
    ({"logprobs": True}, "logprobs", "must be an integer"),
    ({"stream": "yes"}, "stream", "must be a boolean"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream is true"),
    ({"stream": False, "stream_options": {}}, "stream_options", "only allowed when stream is true"),
    ({"stream": True, "stream_options": "usage"}, "stream_options", "must be an object"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage", "boolean"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": ""}, "stop", "must not be an empty string"),
    ({"stop": ["ok", ""]}, "stop", "non-empty strings"),
    ({"echo": "true"}, "echo", "must be a boolean"),
    ({"suffix": 1}, "suffix", "must be a string"),
    ({"presence_penalty": -2.1}, "presence_penalty", "between -2 and 2"),
    ({"frequency_penalty": 2.1}, "frequency_penalty", "between -2 and 2"),
    ({"seed": 1.5}, "seed", "must be an integer"),
    ({"seed": "1"}, "seed", "must be an integer"),
    ({"user": ["u"]}, "user", "must be a string"),
    ({"top_k": 0}, "top_k", "-1 or at least 1"),
    ({"min_p": 1.1}, "min_p", "between 0 and 1"),
    ({"min_tokens": -1}, "min_tokens", "at least 0"),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", "must not exceed max_tokens"),
    ({"repetition_penalty": 2.5}, "repetition_penalty", "between 0 and 2"),
    ({"regex": 1}, "regex", "must be a string"),
    ({"ebnf": 1}, "ebnf", "must be a string"),
    ({"json_schema": {"type": "object"}}, "json_schema", "must be a string"),
    ({"regex": "a", "ebnf": "b"}, "ebnf", "only one of regex and ebnf"),
    ({"regex": "a", "json_schema": "{}"}, "regex", "cannot be combined with json_schema"),
    ({"ebnf": "a", "json_schema": "{}"}, "ebnf", "cannot be combined with json_schema"),
    ({"stop_token_ids": [1, "2"]}, "stop_token_ids", "array of integers"),
    ({"ignore_eos": 0}, "ignore_eos", "must be a boolean"),
    ({"no_stop_trim": "no"}, "no_stop_trim", "must be a boolean"),
    ({"skip_special_tokens": "x"}, "skip_special_tokens", "must be a boolean"),
    ({"return_hidden_states": 1}, "return_hidden_states", "must be a boolean"),
    ({"lora_path": {}}, "lora_path", "must be a string"),
    ({"sampling_seed": 0.5}, "sampling_seed", "must be an integer"),
    ({"rid": 1}, "rid", "must be a string"),
]


@pytest.mark.parametrize(("fields", "param", "fragment"), REJECTED)
def test_it_rejects(fields: dict[str, Any], param: str, fragment: str) -> None:
    assert_rejected(completion(**fields), param, fragment)


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"prompt": "x"}, "model", "model is required"),
        ({"model": "", "prompt": "x"}, "model", "non-empty string"),
        ({"model": ["m"], "prompt": "x"}, "model", "non-empty string"),
        ({"model": MODEL}, "prompt", "prompt is required"),
        ("not an object", None, "must be a JSON object"),
    ],
)
def test_it_rejects_missing_model_or_prompt(body: Any, param: str | None, fragment: str) -> None:
    assert_rejected(body, param, fragment)


def test_it_reports_the_stream_flag_and_model() -> None:
    result = validate_completion(completion(stream=True))
    assert result.stream is True
    assert result.model == MODEL
    assert validate_completion(completion()).stream is False


def test_numbers_are_kept_as_sent() -> None:
    body = completion(temperature=1, top_p=0.95, max_tokens=7, unknown={"x": 1.5})
    validate_completion(body)
    assert type(body["temperature"]) is int
    assert body["top_p"] == 0.95
    assert body["unknown"] == {"x": 1.5}

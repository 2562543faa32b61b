"""The typed turn: each surface's mapper fills every field the pipeline reads, so no stage reads a
request body (the chat schema's and the Responses API's mappers here)."""

from __future__ import annotations

from inference.pipeline.turn import Turn, chat_turn
from inference.upstreams.engine import ConstraintKind
from responses_api.to_chat import ToolNames, chat_tools, responses_turn

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_a_chat_body_maps_to_a_turn() -> None:
    body = {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": "required",
        "max_completion_tokens": 7, "stop": "END", "temperature": 0.5, "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False}, "continue_final_message": True,
        "separate_reasoning": False, "stream_reasoning": False, "no_stop_trim": True,
    }  # fmt: skip
    turn = chat_turn(body, "canonical", stream=True)
    assert isinstance(turn, Turn) and turn.model == "canonical" and turn.stream and turn.prompt_param == "messages"
    assert turn.messages == body["messages"]
    assert turn.tool_choice.mode == "required" and turn.tool_choice.constrained
    assert turn.sampling.max_new_tokens == 7 and turn.sampling.stop == ("END",) and turn.sampling.temperature == 0.5
    assert turn.sampling.constraint is not None and turn.sampling.constraint.kind is ConstraintKind.JSON_SCHEMA
    assert turn.template.thinking.effort == "low" and turn.template.chat_template_kwargs == {"enable_thinking": False}
    assert turn.template.continue_final_message
    assert not turn.output.separate_reasoning and not turn.output.stream_reasoning and turn.output.no_stop_trim


def test_a_plain_chat_body_keeps_the_defaults() -> None:
    turn = chat_turn({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "m", stream=False)
    assert turn.tool_choice.mode == "none" and turn.sampling.constraint is None and turn.sampling.n == 1
    assert turn.output.separate_reasoning and turn.output.stream_reasoning and not turn.output.no_stop_trim
    assert not turn.template.continue_final_message and turn.template.thinking.effort is None


def test_a_responses_request_maps_to_a_turn() -> None:
    names = ToolNames()
    tools = chat_tools([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}], names)
    body = {
        "model": "m", "input": "hi", "max_output_tokens": 32, "top_p": 0.9, "stop": ["a", "b"],
        "reasoning": {"summary": "auto"}, "text": {"format": {"type": "json_object"}}, "top_logprobs": 2,
        "tool_choice": {"type": "function", "name": "get_weather"},
    }  # fmt: skip
    messages = [{"role": "user", "content": "hi"}]
    turn = responses_turn(body, "canonical", messages, tools, names, stream=False)
    assert turn.model == "canonical" and turn.prompt_param == "input" and turn.messages == messages
    assert turn.tool_choice.mode == "named" and turn.tool_choice.name == "get_weather"
    sampling = turn.sampling
    assert sampling.max_new_tokens == 32 and sampling.top_p == 0.9 and sampling.stop == ("a", "b")
    assert sampling.logprobs and sampling.top_logprobs == 2
    # The named tool's schema constrains the output before the text format does.
    assert sampling.constraint is not None and sampling.constraint.kind is ConstraintKind.JSON_SCHEMA
    assert turn.template.thinking.effort == "medium"  # a reasoning object without effort
    assert turn.template.response_format == {"type": "json_object"}


def test_a_responses_text_format_constrains_the_output_when_no_tool_does() -> None:
    body = {"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}}}
    turn = responses_turn(body, "m", [{"role": "user", "content": "hi"}], [], ToolNames(), stream=True)
    assert turn.tool_choice.mode == "none" and turn.stream
    assert turn.sampling.constraint is not None and turn.sampling.constraint.kind is ConstraintKind.JSON_OBJECT
    assert turn.template.thinking.effort is None

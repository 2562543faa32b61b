"""The Messages mapper onto the typed turn (inference/served/messages_turn.py): what the validated
request becomes for the chat template, the tool parser, the constraint and the engine's sampling."""

from __future__ import annotations

from typing import Any

import pytest

from inference.errors import GatewayError
from inference.schemas.messages import validate_count_tokens, validate_messages
from inference.served.messages_turn import has_images, messages_turn
from inference.upstreams.engine import ConstraintKind

WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
IMAGE = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}


def turn_of(**fields: Any) -> Any:
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}], **fields}
    return messages_turn(validate_messages(body).parsed, "canonical", stream=True)


def test_blocks_become_the_chat_messages_templates_read() -> None:
    turn = turn_of(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}], messages=[
        {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "redacted_thinking", "data": "x"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
        ]},
        {"role": "user", "content": [
            {"type": "text", "text": "before"},
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "cold"}, {"type": "text", "text": "windy"}]},
            {"type": "text", "text": "after"},
        ]},
    ])  # fmt: skip
    assert list(turn.messages) == [
        {"role": "system", "content": "A\nB"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm",
         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "user", "content": [{"type": "text", "text": "before"}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "cold\nwindy"},
        {"role": "user", "content": [{"type": "text", "text": "after"}]},
    ]  # fmt: skip
    assert turn.model == "canonical" and turn.stream and not turn.template.continue_final_message


def test_sampling_goes_to_the_engine_and_stop_sequences_to_the_gateway() -> None:
    turn = turn_of(temperature=0.5, top_p=0.9, top_k=4, stop_sequences=["END"])
    sampling = turn.sampling
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (9, 0.5, 0.9, 4)
    assert sampling.stop == ("END",) and sampling.constraint is None
    neutral = turn_of().sampling
    assert (neutral.temperature, neutral.top_p, neutral.top_k) == (1.0, 1.0, -1)


@pytest.mark.parametrize(
    ("choice", "mode", "constrained"),
    [(None, "auto", False), ({"type": "auto"}, "auto", False), ({"type": "any"}, "required", True),
     ({"type": "tool", "name": "get_weather"}, "named", True), ({"type": "none"}, "none", False)],
)  # fmt: skip
def test_tool_choice_maps_and_other_tool_types_are_dropped(choice: Any, mode: str, constrained: bool) -> None:
    fields: dict[str, Any] = {"tools": [WEATHER, {"type": "bash_20250124", "name": "bash"}]}
    if choice is not None:
        fields["tool_choice"] = choice
    turn = turn_of(**fields)
    assert turn.tool_choice.mode == mode and turn.tool_choice.constrained is constrained
    assert (turn.sampling.constraint is not None) is constrained
    if constrained:
        assert turn.sampling.constraint is not None and turn.sampling.constraint.kind is ConstraintKind.JSON_SCHEMA
    if mode != "none":
        assert [tool["function"]["name"] for tool in turn.tool_choice.tools] == ["get_weather"]


@pytest.mark.parametrize(
    ("thinking", "kind", "separate"),
    [(None, None, True), ({"type": "enabled", "budget_tokens": 10}, "enabled", True),
     ({"type": "adaptive"}, "enabled", True), ({"type": "disabled"}, "disabled", False)],
)  # fmt: skip
def test_thinking_turns_template_thinking_and_the_reasoning_parser(thinking: Any, kind: str | None, separate: bool) -> None:
    turn = turn_of(**({"thinking": thinking} if thinking else {}))
    assert turn.template.thinking.type == kind and turn.output.separate_reasoning is separate


def test_a_final_assistant_text_is_continued_and_count_tokens_maps_the_same() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "Sure"}]}]
    assert turn_of(messages=messages).template.continue_final_message
    counted = messages_turn(validate_count_tokens({"model": "m", "messages": messages}).parsed, "m", stream=False)
    assert counted.messages == turn_of(messages=messages).messages and counted.sampling.max_new_tokens is None


def test_a_document_is_its_text_else_refused() -> None:
    as_text = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}}
    assert turn_of(messages=[{"role": "user", "content": [as_text]}]).messages == [{"role": "user", "content": [{"type": "text", "text": "doc"}]}]
    pdf = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
    with pytest.raises(GatewayError) as refused:
        turn_of(messages=[{"role": "user", "content": [pdf]}])
    assert refused.value.status == 400 and refused.value.code == "process_messages_failed"


def test_images_are_found_at_the_top_level_and_in_tool_results() -> None:
    def parsed(content: Any) -> Any:
        return validate_messages({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}).parsed

    assert not has_images(parsed("hi")) and not has_images(parsed([{"type": "text", "text": "hi"}]))
    assert has_images(parsed([IMAGE]))
    assert has_images(parsed([{"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}]))

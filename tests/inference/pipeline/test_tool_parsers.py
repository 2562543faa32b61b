"""Tool-call parsers: every family over realistic outputs (the fixture templates' own rendering
of assistant tool calls where a fixture exists, the families' documented formats otherwise),
whole and cut at every boundary, streaming equal to non-streaming."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.pipeline.events import TextDelta, ToolCallDelta
from inference.pipeline.reasoning import REASONING_PARSERS
from inference.pipeline.tools import TOOL_PARSERS, ToolParser
from tests.inference.pipeline.splitting import assistant_turn, counter_ids, every_split, render_fixture, run_tools

WEATHER = {"city": "Paris", "unit": "celsius"}
TIME = {"zone": "CET"}
CALLS = [
    {"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER}},
    {"id": "bcdefghij", "type": "function", "function": {"name": "get_time", "arguments": TIME}},
]
USER = [{"role": "user", "content": "Weather in Paris?"}]


def _string_arguments(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}} for c in calls]


def _turn(folder: str, template: str | None, calls: list[dict[str, Any]], content: Any = "") -> str:
    conversation = [*USER, {"role": "assistant", "content": content, "tool_calls": calls}]
    return assistant_turn(render_fixture(folder, template, conversation), render_fixture(folder, template, USER))


def _qwen3_output() -> str:
    turn = _turn("qwen3", None, CALLS)
    return turn.removeprefix("<|im_start|>assistant\n<think>\n\n</think>\n\n").removesuffix("<|im_end|>\n")


def _deepseek_v31_output() -> str:
    turn = _turn("deepseek-r1", "chat_template.deepseek-v3.1.jinja", _string_arguments(CALLS), None)
    return turn.removeprefix("<｜Assistant｜></think>").removesuffix("<｜end▁of▁sentence｜>")


def _deepseek_r1_output() -> str:
    turn = _turn("deepseek-r1", None, _string_arguments(CALLS), None)
    return turn.removeprefix("<｜Assistant｜>").removesuffix("<｜end▁of▁sentence｜>")


def _llama_output() -> str:
    turn = _turn("llama3", "chat_template.llama-3.2.jinja", CALLS[:1])
    return turn.removeprefix("<|start_header_id|>assistant<|end_header_id|>\n\n").removesuffix("<|eot_id|>")


def _mistral_output() -> str:
    return _turn("mistral", None, CALLS).removesuffix("</s>")


W, T = json.dumps(WEATHER), json.dumps(TIME)
BOTH = [("get_weather", W), ("get_time", T)]

# (parser name, output, content, [(name, arguments)], model-written ids or None)
CASES: list[tuple[str, str, str, list[tuple[str, str]], list[str] | None]] = [
    ("qwen", _qwen3_output(), "", BOTH, None),
    ("hermes", "Let me look.\n\n" + _qwen3_output(), "Let me look.", BOTH, None),
    ("qwen25", '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}\n</tool_call>', "", [("get_time", T)], None),
    ("deepseek31", _deepseek_v31_output(), "", BOTH, None),
    ("deepseek31", "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"CET\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "Checking.", [("get_time", T)], None),
    ("deepseek", _deepseek_r1_output(), "", BOTH, None),
    ("llama", _llama_output(), "", [("get_weather", W)], None),
    ("llama", "<|python_tag|>" + _llama_output() + "; " + '{"name": "get_time", "parameters": {"zone": "CET"}}', "", BOTH, None),
    ("llama", '{"answer": 42}', '{"answer": 42}', [], None),
    ("mistral", _mistral_output(), "", BOTH, ["abcdefghi", "bcdefghij"]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"zone": "CET"}', "", BOTH, ["call_0", "a1b2c3d4e"]),
    ("mistral", "Sure [TOOL] is not [TOOL_CALLS", "Sure [TOOL] is not [TOOL_CALLS", [], None),
    ("kimik2", 'I will check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris", "unit": "celsius"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"zone": "CET"}<|tool_call_end|><|tool_calls_section_end|>', "I will check.", BOTH, ["functions.get_weather:0", "functions.get_time:1"]),
    ("glm45", "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>", "Checking.", BOTH, None),
    ("glm47", "<tool_call>get_time<arg_key>zone</arg_key><arg_value>CET</arg_value></tool_call>", "", [("get_time", T)], None),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n<parameter name="unit">celsius</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="zone">CET</parameter>\n</invoke>\n</minimax:tool_call>', "", BOTH, None),
    ("pythonic", '[get_weather(city="Paris", unit="celsius"), get_time(zone=\'CET\')]', "", BOTH, None),
    ("pythonic", '<|python_start|>[get_time(zone="CET")]<|python_end|>', "", [("get_time", T)], None),
    ("pythonic", "[1] is a citation, not a call.", "[1] is a citation, not a call.", [], None),
    ("json", '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]', "", BOTH, None),
    ("json", '{"name": "get_time", "parameters": {"zone": "CET"}}', "", [("get_time", T)], None),
    ("passthrough", "<tool_call>{}</tool_call>", "<tool_call>{}</tool_call>", [], None),
    # malformed calls are content, markers and all, in a stream as in a whole parse
    ("qwen", 'Text <tool_call>\n{"name": "get_time", "arguments": {"zone": }\n</tool_call>', 'Text<tool_call>\n{"name": "get_time", "arguments": {"zone": }\n</tool_call>', [], None),
    ("qwen", "Cut off <tool_call>\n{\"name\": \"get_ti", "Cut off<tool_call>\n{\"name\": \"get_ti", [], None),
    ("deepseek31", "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>not json<｜tool▁call▁end｜>", "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>not json<｜tool▁call▁end｜>", [], None),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": ", "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": ", [], None),
    ("qwen", "No tools here, just a < sign and <tool_ca", "No tools here, just a < sign and <tool_ca", [], None),
]


@pytest.mark.parametrize(("name", "output", "content", "calls", "ids"), CASES)
def test_every_split_gives_the_same_content_and_calls(
    name: str, output: str, content: str, calls: list[tuple[str, str]], ids: list[str] | None
) -> None:
    cls = TOOL_PARSERS.get(name)
    whole = cls.parse(output, make_id=counter_ids())
    assert whole.content == content
    assert [(c.name, c.arguments) for c in whole.tool_calls] == calls
    expected_ids = ids or [f"call_{i}" for i in range(len(calls))]
    assert [c.id for c in whole.tool_calls] == expected_ids
    for chunks in every_split(output):
        got_content, got_calls, events = run_tools(lambda: cls(make_id=counter_ids()), chunks)
        assert got_content == content, chunks
        assert got_calls == [(i, n, a) for i, (n, a) in zip(expected_ids, calls)], chunks
        if calls:
            for event in events:
                if isinstance(event, TextDelta):
                    assert not any(m in event.text for m in (*cls.start_markers, *cls.drop_markers)), event


def test_text_streams_at_once_and_holds_only_a_possible_marker() -> None:
    parser = TOOL_PARSERS.get("qwen")(make_id=counter_ids())
    assert parser.feed("It is ") == [TextDelta("It is")]
    assert parser.feed("sunny <tool") == [TextDelta(" sunny")]
    assert parser.feed("box>") == [TextDelta(" <toolbox>")]
    assert parser.feed('<tool_call>{"name": "f", "arguments": {"a": 1}}') == []
    assert parser.feed("</tool_call>") == [ToolCallDelta(0, "call_0", "f", ""), ToolCallDelta(0, None, None, '{"a": 1}')]
    assert parser.has_tool_calls
    assert parser.finish() == []


def test_schema_keeps_string_arguments_strings() -> None:
    output = "<tool_call>set_code\n<arg_key>code</arg_key>\n<arg_value>123</arg_value>\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n</tool_call>"
    tools = {"set_code": {"type": "object", "properties": {"code": {"type": "string"}, "n": {"type": "integer"}}}}
    parsed = TOOL_PARSERS.get("glm45").parse(output, tools=tools)
    assert json.loads(parsed.tool_calls[0].arguments) == {"code": "123", "n": 7}
    untyped = TOOL_PARSERS.get("glm45").parse(output)
    assert json.loads(untyped.tool_calls[0].arguments) == {"code": 123, "n": 7}


def test_reasoning_then_tools_over_a_qwen3_thinking_turn() -> None:
    output = "<think>\nThe user wants the weather.\n</think>\n\n" + _qwen3_output()
    for chunks in every_split(output):
        reasoning = REASONING_PARSERS.get("qwen3")()
        tools: ToolParser = TOOL_PARSERS.get("qwen")(make_id=counter_ids())
        thought, content, calls = "", "", []
        for chunk in [*chunks, None]:
            events = reasoning.feed(chunk) if chunk is not None else reasoning.finish()
            for event in events:
                if isinstance(event, TextDelta):
                    for out in tools.feed(event.text):
                        if isinstance(out, TextDelta):
                            content += out.text
                        else:
                            calls.append(out)
                else:
                    thought += event.text
        for out in tools.finish():
            assert not isinstance(out, TextDelta)
            calls.append(out)
        assert thought == "The user wants the weather."
        assert content == ""
        assert [c.name for c in calls if c.name] == ["get_weather", "get_time"]


def test_registry_names() -> None:
    expected = {
        "qwen", "qwen25", "hermes", "llama", "llama3_json", "mistral", "deepseek", "deepseek_v3",
        "deepseek31", "deepseek_v31", "kimik2", "kimi_k2", "glm45", "glm4_moe", "glm47", "minimax_m2",
        "pythonic", "llama4_pythonic", "json", "passthrough",
    }  # fmt: skip
    assert expected <= set(TOOL_PARSERS.names())


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("qwen", "<tool_call>" + "[" * 100_000 + "</tool_call>"),
        ("llama", "[" * 100_000),
        ("mistral", "[TOOL_CALLS]" + "[" * 100_000),
        ("json", "[" * 100_000),
        ("pythonic", "[f()," * 20_000),
    ],
)
def test_output_nested_past_the_parsers_depth_is_text(name: str, text: str) -> None:
    parsed = TOOL_PARSERS.get(name).parse(text)
    assert parsed.tool_calls == ()
    assert parsed.content.strip()

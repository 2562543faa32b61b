"""Reasoning parsers: every family over realistic outputs, whole and cut at every boundary."""

from __future__ import annotations

import pytest

from inference.pipeline.events import ReasoningDelta, TextDelta
from inference.pipeline.reasoning import REASONING_PARSERS, ParsedReasoning, ReasoningParser, prompt_reasoning_state
from inference.pipeline.reasoning.deepseek import DeepSeekR1ReasoningParser, DeepSeekV3ReasoningParser
from inference.pipeline.reasoning.qwen3 import Qwen3ReasoningParser
from tests.inference.pipeline.splitting import every_split, render_fixture, run_reasoning

# (parser name, in_reasoning, model output, reasoning, content)
CASES = [
    ("qwen3", None, "<think>\nThe user wants 2+2.\nThat is 4.\n</think>\n\nThe answer is 4.", "The user wants 2+2.\nThat is 4.", "The answer is 4."),
    ("qwen3", None, "The user wants 2+2.\n</think>\n\nFour.", "The user wants 2+2.", "Four."),
    ("qwen3", False, "Plain answer, thinking was off.", "", "Plain answer, thinking was off."),
    ("qwen3", False, "<think>\nx < y and </thin are not markers\n</think>\n\nok", "x < y and </thin are not markers", "ok"),
    ("deepseek_r1", None, "Okay, 9.11 vs 9.9.\n</think>\n\n9.9 is larger.", "Okay, 9.11 vs 9.9.", "9.9 is larger."),
    ("deepseek_r1", None, "<think>\nR1-0528 repeats the tag.\n</think>\n\nDone.", "R1-0528 repeats the tag.", "Done."),
    ("deepseek_r1", None, "cut off by max_tokens while still thinking <", "cut off by max_tokens while still thinking <", ""),
    ("deepseek_v3", True, "Thinking in V3.1.</think>Answer with </think> inside.", "Thinking in V3.1.", "Answer with </think> inside."),
    ("deepseek_v3", False, "No thinking: <think> is just text here.", "", "No thinking: <think> is just text here."),
    ("glm45", None, "<think>Let me consider the options.</think>\nUse option B.", "Let me consider the options.", "Use option B."),
    ("glm45", None, "Hello there.", "", "Hello there."),
    ("kimi", None, "◁think▷The user greets me.◁/think▷Hi!", "The user greets me.", "Hi!"),
    ("kimi_k2", None, "<think>Check the weather tool.</think>It is sunny.", "Check the weather tool.", "It is sunny."),
    ("minimax", None, "I should answer briefly.\n</think>\n\nYes.", "I should answer briefly.", "Yes."),
    ("step3", None, "step by step\n</think>\nresult", "step by step", "result"),
    ("mistral", None, "[THINK]Compute 3*7.[/THINK]21", "Compute 3*7.", "21"),
    ("qwen3", None, "  <think>\n\n</think>\n\nEmpty thoughts.", "", "Empty thoughts."),
    ("glm45", None, "<thin", "", "<thin"),
]


def _make(name: str, in_reasoning: bool | None, **options: bool) -> ReasoningParser:
    return REASONING_PARSERS.get(name)(in_reasoning=in_reasoning, **options)


@pytest.mark.parametrize(("name", "in_reasoning", "output", "reasoning", "content"), CASES)
def test_every_split_gives_the_same_reasoning_and_content(
    name: str, in_reasoning: bool | None, output: str, reasoning: str, content: str
) -> None:
    cls = REASONING_PARSERS.get(name)
    assert cls.parse(output, in_reasoning=in_reasoning) == ParsedReasoning(reasoning, content)
    for chunks in every_split(output):
        got_reasoning, got_content, events = run_reasoning(lambda: _make(name, in_reasoning), chunks)
        assert (got_reasoning, got_content) == (reasoning, content), chunks
        for event in events:
            if isinstance(event, ReasoningDelta):
                assert cls.start_marker not in event.text and cls.end_marker not in event.text
                assert event.text


@pytest.mark.parametrize(("name", "in_reasoning", "output", "reasoning", "content"), CASES)
def test_stream_reasoning_off_sends_the_reasoning_once_before_the_content(
    name: str, in_reasoning: bool | None, output: str, reasoning: str, content: str
) -> None:
    for chunks in (list(output), [output]):
        _, _, events = run_reasoning(lambda: _make(name, in_reasoning, stream_reasoning=False), chunks)
        pieces = [e for e in events if isinstance(e, ReasoningDelta)]
        assert [e.text for e in pieces] == ([reasoning] if reasoning else [])
        if pieces:
            assert events.index(pieces[0]) == 0 or all(isinstance(e, ReasoningDelta) for e in events[: events.index(pieces[0])])
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == content


def test_separate_reasoning_off_passes_the_text_through_with_its_markers() -> None:
    output = "<think>\nhmm\n</think>\n\nAnswer"
    for chunks in every_split(output):
        got_reasoning, got_content, _ = run_reasoning(lambda: Qwen3ReasoningParser(separate_reasoning=False), chunks)
        assert (got_reasoning, got_content) == ("", output)
    assert Qwen3ReasoningParser.parse(output, separate_reasoning=False) == ParsedReasoning("", output)


def test_streamed_reasoning_arrives_before_the_block_closes() -> None:
    parser = DeepSeekR1ReasoningParser()
    assert parser.feed("First thought") == [ReasoningDelta("First thought")]
    assert parser.feed(", second</th") == [ReasoningDelta(", second")]
    assert parser.feed("ink>\n\nAns") == [TextDelta("Ans")]
    assert parser.feed("wer") == [TextDelta("wer")]
    assert parser.finish() == []


def test_text_that_only_looked_like_a_marker_is_released() -> None:
    parser = DeepSeekV3ReasoningParser(in_reasoning=True)
    assert parser.feed("a </thin") == [ReasoningDelta("a")]
    assert parser.feed("g> b") == [ReasoningDelta(" </thing> b")]


def test_the_rendered_prompt_decides_whether_the_output_starts_inside_reasoning() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    off = render_fixture("qwen3", None, messages, add_generation_prompt=True, enable_thinking=False)
    on = render_fixture("qwen3", None, messages, add_generation_prompt=True)
    assert prompt_reasoning_state(off, "<think>", "</think>") is False
    assert prompt_reasoning_state(on, "<think>", "</think>") is None
    assert Qwen3ReasoningParser.for_prompt(off).in_reasoning is False
    assert Qwen3ReasoningParser.for_prompt(on).in_reasoning is True  # the reference gateway's rule

    v31_on = render_fixture("deepseek-r1", "chat_template.deepseek-v3.1.jinja", messages, add_generation_prompt=True, thinking=True)
    v31_off = render_fixture("deepseek-r1", "chat_template.deepseek-v3.1.jinja", messages, add_generation_prompt=True)
    assert DeepSeekV3ReasoningParser.for_prompt(v31_on).in_reasoning is True
    assert DeepSeekV3ReasoningParser.for_prompt(v31_off).in_reasoning is False

    distill = render_fixture("deepseek-r1", "chat_template.deepseek-r1-distill.jinja", messages, add_generation_prompt=True)
    assert distill.endswith("<think>\n")
    assert DeepSeekR1ReasoningParser.for_prompt(distill).in_reasoning is True
    assert DeepSeekV3ReasoningParser.for_prompt(distill).in_reasoning is True


def test_registry_names() -> None:
    expected = {
        "qwen3", "qwen3_thinking", "qwq", "deepseek_r1", "deepseek_v3", "deepseek_v31", "deepseek31",
        "glm45", "glm47", "kimi", "kimi_k2", "kimi_k25", "minimax", "minimax_m2", "step3", "mistral",
    }  # fmt: skip
    assert expected <= set(REASONING_PARSERS.names())
    assert REASONING_PARSERS.get("DeepSeek-R1") is DeepSeekR1ReasoningParser

"""Choosing parsers: by name (card > labels > flag), unknown names, detection from the family."""

from __future__ import annotations

import pytest

from inference.pipeline.parsers import (
    ParserChoice,
    UnknownParser,
    check_parser_names,
    choose_parsers,
    reasoning_parser_class,
    tool_parser_class,
)
from inference.pipeline.reasoning import REASONING_PARSERS
from inference.pipeline.tools import TOOL_PARSERS
from inference.schemas.families import FAMILIES, ModelFamily, detect_family


@pytest.mark.parametrize(
    ("model", "family", "tool", "reasoning"),
    [
        ("Qwen/Qwen3-8B", ModelFamily.QWEN3, "qwen", "qwen3"),
        ("Qwen/Qwen2.5-7B-Instruct", ModelFamily.QWEN, "qwen", None),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", ModelFamily.DEEPSEEK_R1, "deepseek", "deepseek_r1"),
        ("deepseek-ai/DeepSeek-V3.1", ModelFamily.DEEPSEEK_V31, "deepseek31", "deepseek_v3"),
        ("deepseek-ai/DeepSeek-V3-0324", ModelFamily.DEEPSEEK_V3, "deepseek", None),
        ("deepseek-v4-flash", ModelFamily.DEEPSEEK_V4, None, "deepseek_v3"),
        ("meta-llama/Llama-3.1-8B-Instruct", ModelFamily.LLAMA, "llama", None),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", ModelFamily.LLAMA4, "pythonic", None),
        ("mistralai/Mistral-7B-Instruct-v0.3", ModelFamily.MISTRAL, "mistral", None),
        ("mistralai/Magistral-Small-2506", ModelFamily.MAGISTRAL, "mistral", "mistral"),
        ("moonshotai/Kimi-K2-Instruct", ModelFamily.KIMI, "kimik2", "kimi_k2"),
        ("zai-org/GLM-4.5", ModelFamily.GLM, "glm45", "glm45"),
        ("MiniMaxAI/MiniMax-M2", ModelFamily.MINIMAX, "minimax_m2", "minimax"),
        ("openai/gpt-oss-20b", ModelFamily.GPT_OSS, None, None),
        ("my-finetune", None, None, None),
    ],
)
def test_family_detection_picks_the_parsers(model: str, family: ModelFamily | None, tool: str | None, reasoning: str | None) -> None:
    assert detect_family(model) is family
    assert choose_parsers(model) == ParserChoice(tool, reasoning)


def test_architectures_decide_when_the_id_says_nothing() -> None:
    assert detect_family("served-model", architectures=["Qwen3ForCausalLM"]) is ModelFamily.QWEN3
    assert detect_family("served-model", model_type="glm4_moe") is ModelFamily.GLM
    assert detect_family("served-model", architectures=["Unknown"]) is None


def test_every_family_names_registered_parsers() -> None:
    for info in FAMILIES:
        if info.tool_parser:
            assert info.tool_parser in TOOL_PARSERS
        if info.reasoning_parser:
            assert info.reasoning_parser in REASONING_PARSERS


def test_card_wins_over_labels_over_flags_over_detection() -> None:
    model = "Qwen/Qwen3-8B"
    flags = ParserChoice("hermes", "deepseek_r1")
    labels = ParserChoice("json", None)
    card = ParserChoice(None, "glm45")
    assert choose_parsers(model, flags=flags) == ParserChoice("hermes", "deepseek_r1")
    assert choose_parsers(model, flags=flags, labels=labels) == ParserChoice("json", "deepseek_r1")
    assert choose_parsers(model, flags=flags, labels=labels, card=card) == ParserChoice("json", "glm45")


def test_an_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(UnknownParser) as raised:
        choose_parsers("Qwen/Qwen3-8B", card=ParserChoice("qwen4", None))
    assert raised.value.kind == "tool parser" and raised.value.name == "qwen4"
    assert "qwen25" in str(raised.value)
    with pytest.raises(UnknownParser):
        check_parser_names(reasoning_parser="thinky")
    with pytest.raises(LookupError):
        reasoning_parser_class("nope")


def test_names_ignore_case_and_dashes() -> None:
    assert tool_parser_class("Minimax-M2") is tool_parser_class("minimax_m2")
    assert reasoning_parser_class("DeepSeek-R1") is reasoning_parser_class("deepseek_r1")


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError):
        TOOL_PARSERS.register("qwen")(type("Other", (tool_parser_class("json"),), {}))

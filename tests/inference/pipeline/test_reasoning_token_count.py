"""A choice's reasoning tokens (:class:`ReasoningTokenCount` inside :class:`ChoiceOutput`), with the
real fixture tokenizers and parsers: the output tokens from the start through the token that closes
the block, however the engine splits the output into steps; none without a block."""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Sequence

import pytest

from inference.pipeline.choices import ChoiceOptions, ChoiceOutput
from inference.pipeline.reasoning import REASONING_PARSERS, ReasoningParser
from inference.pipeline.stops import StopTokens
from inference.pipeline.tokenizers import ModelTokenizer, load_tokenizer
from inference.upstreams.engine import EngineOutput, Finish, FinishReason
from standins.fixtures import FIXTURE_MODELS

QWEN_OPEN_TURN = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
QWEN_CLOSED_TURN = QWEN_OPEN_TURN + "<think>\n\n</think>\n\n"
REASONING = "Two plus two: add them, 4. Check — ✓."
ANSWER = "The answer is 4."


@lru_cache(maxsize=None)
def fixture(name: str) -> ModelTokenizer:
    return load_tokenizer(FIXTURE_MODELS / name)


def qwen() -> ModelTokenizer:
    return fixture("qwen3")


def run(
    tokenizer: ModelTokenizer, ids: Sequence[int], step: int, parser: partial[ReasoningParser], *,
    end_marker: str | None, stops: tuple[str, ...] = (),
) -> int:  # fmt: skip
    """The choice's reasoning tokens once ``ids`` arrived ``step`` at a time, then the finish."""
    options = ChoiceOptions(
        stop_tokens=StopTokens.build((), tokenizer.eos_token_ids),
        stops=stops,
        reasoning=parser,
        reasoning_end_id=tokenizer.single_token_id(end_marker) if end_marker else None,
    )
    choice = ChoiceOutput(0, tokenizer, options)
    for at in range(0, len(ids), step):
        choice.step(EngineOutput(token_ids=tuple(ids[at : at + step]), completion_tokens=at + step))
    choice.step(EngineOutput(completion_tokens=len(ids), finish=Finish(FinishReason.LENGTH)))
    assert choice.done
    return choice.reasoning_tokens


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_the_count_ends_on_the_end_marker_token_whatever_the_steps(step: int) -> None:
    tok = qwen()
    block = tok.encode(f"<think>\n{REASONING}\n</think>")
    ids = [*block, *tok.encode(f"\n\n{ANSWER}")]
    parser = partial(REASONING_PARSERS.get("qwen3").for_prompt, QWEN_OPEN_TURN)
    assert run(tok, ids, step, parser, end_marker="</think>") == len(block)


@pytest.mark.parametrize("step", [1, 3])
def test_a_prompt_that_closed_the_block_has_no_reasoning_tokens(step: int) -> None:
    tok = qwen()
    ids = tok.encode(f"{ANSWER} </think> more")  # an end marker in content is not the end of a block
    parser = partial(REASONING_PARSERS.get("qwen3").for_prompt, QWEN_CLOSED_TURN)
    assert run(tok, ids, step, parser, end_marker="</think>") == 0


def test_an_output_that_ends_inside_the_block_is_all_reasoning() -> None:
    tok = qwen()
    ids = tok.encode(f"<think>\n{REASONING}")
    parser = partial(REASONING_PARSERS.get("qwen3").for_prompt, QWEN_OPEN_TURN)
    assert run(tok, ids, 2, parser, end_marker="</think>") == len(ids)


def test_no_parsing_counts_nothing() -> None:
    tok = qwen()
    ids = tok.encode(f"<think>\n{REASONING}\n</think>\n\n{ANSWER}")
    parser = partial(REASONING_PARSERS.get("qwen3").for_prompt, QWEN_OPEN_TURN, separate_reasoning=False)
    assert run(tok, ids, 1, parser, end_marker="</think>") == 0


def test_an_end_marker_held_back_by_a_stop_string_is_still_counted_to_its_token() -> None:
    """A stop string that begins like the end marker holds ``</think>`` back for a step: the parser
    sees the block close a step late, and the count still ends on the marker's token."""
    tok = qwen()
    block = tok.encode(f"<think>\n{REASONING}\n</think>")
    ids = [*block, *tok.encode(f"\n\n{ANSWER}")]
    parser = partial(REASONING_PARSERS.get("qwen3").for_prompt, QWEN_OPEN_TURN)
    assert run(tok, ids, 1, parser, end_marker="</think>", stops=("</think>!",)) == len(block)


@pytest.mark.parametrize("step", [1, 4])
def test_an_end_marker_of_several_tokens_ends_the_count_with_its_step(step: int) -> None:
    """Magistral's [THINK]…[/THINK] with a tokenizer that has no [/THINK] token (the Mistral v0.3
    fixture): exact when the engine streams a token per step, else up to the step's end."""
    tok = fixture("mistral")
    assert tok.single_token_id("[/THINK]") is None
    block = tok.encode(f"[THINK]{REASONING}[/THINK]")
    ids = [*block, *tok.encode(f" {ANSWER}")]
    parser = partial(REASONING_PARSERS.get("mistral"))
    counted = run(tok, ids, step, parser, end_marker="[/THINK]")
    exact = len(block)
    assert counted == exact if step == 1 else exact <= counted < exact + step

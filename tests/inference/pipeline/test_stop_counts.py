"""A stop the gateway finds inside an engine output ends the choice's completion tokens at the token
that made it (through it), as an engine that applies the stop itself counts, however the engine split
its output into steps; the text sent is the same for every split. Real fixture tokenizer."""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import AsyncIterator, Sequence

import pytest

from inference.pipeline.chat_turn import turn_events
from inference.pipeline.choices import ChoiceOptions, ChoiceOutput
from inference.pipeline.events import Finished, TextDelta
from inference.pipeline.stops import StopTokens
from inference.pipeline.tokenizers import ModelTokenizer, load_tokenizer
from inference.pipeline.usage import UsageTally
from inference.upstreams.engine import EngineOutput, Finish, FinishReason
from standins.fixtures import FIXTURE_MODELS

TEXT = "One apple, two pears. STOP here and then much more text that never should count."


@lru_cache(maxsize=None)
def qwen() -> ModelTokenizer:
    return load_tokenizer(FIXTURE_MODELS / "qwen3")


def _outputs(ids: Sequence[int], step: int, finish: bool = True) -> list[EngineOutput]:
    outputs = [
        EngineOutput(token_ids=tuple(ids[at : at + step]), completion_tokens=min(at + step, len(ids)))
        for at in range(0, len(ids), step)
    ]
    if finish:
        outputs.append(EngineOutput(completion_tokens=len(ids), finish=Finish(FinishReason.LENGTH)))
    return outputs


def _run(ids: Sequence[int], step: int, stops: tuple[str, ...] = (), stop_ids: tuple[int, ...] = ()) -> tuple[str, ChoiceOutput]:
    tok = qwen()
    choice = ChoiceOutput(0, tok, ChoiceOptions(stop_tokens=StopTokens.build(stop_ids, tok.eos_token_ids), stops=stops))
    text = []
    for output in _outputs(ids, step):
        for event in choice.step(output):
            if isinstance(event, TextDelta):
                text.append(event.text)
        if choice.done:
            break
    return "".join(text), choice


def _tokens_through(ids: Sequence[int], needle: str) -> int:
    """How many of ``ids`` it takes until their text holds ``needle``."""
    tok = qwen()
    for size in range(1, len(ids) + 1):
        if needle in tok.decode(list(ids[:size])):
            return size
    raise AssertionError(needle)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 1000])
def test_a_stop_string_ends_the_count_at_the_token_that_completed_it(step: int) -> None:
    ids = qwen().encode(TEXT)
    text, choice = _run(ids, step, stops=("STOP",))
    assert text == "One apple, two pears. "
    assert choice.completion_tokens == _tokens_through(ids, "STOP")
    assert choice.completion_tokens < len(ids)


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_stop_token_is_counted_and_nothing_after_it(step: int) -> None:
    tok = qwen()
    ids = tok.encode(TEXT)
    stop_at = 6
    text, choice = _run(ids, step, stop_ids=(ids[stop_at],))
    assert text == tok.decode(ids[:stop_at])
    assert choice.completion_tokens == stop_at + 1


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_without_a_match_the_engine_count_stands(step: int) -> None:
    ids = qwen().encode(TEXT)
    text, choice = _run(ids, step, stops=("nowhere in it",))
    assert text == TEXT
    assert choice.completion_tokens == len(ids)


def test_the_usage_tally_takes_the_choice_count() -> None:
    tok = qwen()
    ids = tok.encode(TEXT)
    choice = ChoiceOutput(0, tok, ChoiceOptions(stop_tokens=StopTokens.build((), tok.eos_token_ids), stops=("STOP",)))
    tally = UsageTally(7)

    async def outputs() -> AsyncIterator[EngineOutput]:
        for output in _outputs(ids, 1000, finish=False):
            yield output

    async def drain() -> list[object]:
        return [events async for _choice, events in turn_events(outputs(), [choice], tally.add)]

    seen = asyncio.run(drain())
    assert any(isinstance(event, Finished) for events in seen for event in events)  # type: ignore[attr-defined]
    assert tally.usage().completion_tokens == _tokens_through(ids, "STOP")

"""ChoiceOutput.text_step (D106): the streamed chunk's per-token shortcut reads an output exactly as
step() does (the same text, counts and state after), and takes only the outputs it can (one token, no
finish, no stop token) once the choice can only add content; anything else is left to step(), unread.
Real fixture tokenizer."""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Callable

import pytest

from inference.pipeline.choices import ChoiceOptions, ChoiceOutput
from inference.pipeline.events import Event, TextDelta
from inference.pipeline.reasoning import REASONING_PARSERS
from inference.pipeline.stops import StopTokens
from inference.pipeline.tokenizers import ModelTokenizer, load_tokenizer
from inference.pipeline.tools import TOOL_PARSERS
from inference.upstreams.engine import EngineOutput, Finish, FinishReason
from standins.fixtures import FIXTURE_MODELS

CONTENT = "Plain words, then ünïcödé and 漢字 and an emoji 🙂 at the end."
THINKING = "<think>\nweighing it up\n</think>\n\n" + CONTENT


@lru_cache(maxsize=None)
def qwen() -> ModelTokenizer:
    return load_tokenizer(FIXTURE_MODELS / "qwen3")


def _options(**overrides: object) -> ChoiceOptions:
    tok = qwen()
    options: dict[str, object] = {"stop_tokens": StopTokens.build((), tok.eos_token_ids)}
    options.update(overrides)
    return ChoiceOptions(**options)  # type: ignore[arg-type]


def _qwen3(prompt: str) -> Callable[[], object]:
    return partial(REASONING_PARSERS.get("qwen3").for_prompt, prompt, stream_reasoning=True)


def _outputs(text: str, tail: list[int] | None = None) -> list[EngineOutput]:
    ids = [*qwen().encode(text), *(tail or [])]
    outputs = [EngineOutput(token_ids=(token,), completion_tokens=at + 1) for at, token in enumerate(ids)]
    outputs.append(EngineOutput(completion_tokens=len(ids), finish=Finish(FinishReason.LENGTH)))
    return outputs


def _read(options: ChoiceOptions, outputs: list[EngineOutput], shortcut: bool) -> tuple[list[list[Event]], tuple[object, ...], int]:
    """Each output's events (text_step's text as the event it stands for) and the choice's state."""
    choice = ChoiceOutput(0, qwen(), options)
    seen: list[list[Event]] = []
    taken = 0
    for output in outputs:
        text = choice.text_step(output) if shortcut else None
        if text is None:
            seen.append(choice.step(output))
        else:
            taken += 1
            seen.append([TextDelta(text)] if text else [])
        if choice.done:
            break
    state = (choice.done, choice.completion_tokens, choice.reasoning_tokens, choice.text_length, choice.logprobs)
    return seen, state, taken


CLOSED_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
OPEN_PROMPT = "<|im_start|>assistant\n<think>\n"

CASES = {
    "no parsers": (_options(), CONTENT, True),
    "qwen3, thinking off": (_options(reasoning=_qwen3(CLOSED_PROMPT)), CONTENT, True),
    "qwen3, block in the output": (_options(reasoning=_qwen3("<|im_start|>assistant\n")), THINKING, True),
    "qwen3, prompt opened the block": (
        _options(reasoning=_qwen3(OPEN_PROMPT), reasoning_end_id=qwen().single_token_id("</think>")), THINKING, True
    ),
    "stop strings": (_options(stops=("ëmoji", "end")), CONTENT, False),
    "a tool parser": (_options(tools=partial(TOOL_PARSERS.get("qwen"), tools={})), CONTENT, False),
    "a stop token": (_options(stop_tokens=StopTokens.build((qwen().encode(" and")[0],), ())), CONTENT, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_text_step_reads_as_step(case: str) -> None:
    options, text, takes = CASES[case]
    outputs = _outputs(text)
    stepped, stepped_state, _ = _read(options, outputs, shortcut=False)
    shortcut, shortcut_state, taken = _read(options, outputs, shortcut=True)
    assert shortcut == stepped and shortcut_state == stepped_state
    assert taken > 0 if takes else taken == 0


def test_text_step_leaves_finish_logprobs_and_many_tokens_to_step() -> None:
    choice = ChoiceOutput(0, qwen(), _options())
    ids = qwen().encode(CONTENT)
    assert choice.text_step(EngineOutput(token_ids=(ids[0],), completion_tokens=1)) is None  # before any step()
    choice.step(EngineOutput(token_ids=(ids[0],), completion_tokens=1))
    assert choice.text_step(EngineOutput(token_ids=(ids[1],), completion_tokens=2)) is not None
    unread = [
        EngineOutput(token_ids=(ids[2], ids[3]), completion_tokens=4),
        EngineOutput(token_ids=(ids[2],), completion_tokens=3, finish=Finish(FinishReason.LENGTH)),
        EngineOutput(token_ids=(qwen().eos_token_ids[0],), completion_tokens=3),
    ]
    for output in unread:
        assert choice.text_step(output) is None
    assert choice.completion_tokens == 2 and not choice.done
    choice.step(unread[1])
    assert choice.done and choice.text_step(EngineOutput(token_ids=(ids[3],), completion_tokens=4)) is None

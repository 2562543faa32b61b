"""Usage from the engine's counters (spec 1, usage): the prompt once for n > 1, completions summed,
cached and reasoning tokens, the speculative counters only when the engine reported drafts."""

from __future__ import annotations

from inference.pipeline.usage import UsageTally
from inference.served.openai_shapes import usage_json
from inference.upstreams.engine import EngineOutput, Finish, FinishReason

DONE = Finish(FinishReason.STOP)


def test_n_choices_count_the_prompt_once_and_sum_completions() -> None:
    tally = UsageTally(10)
    tally.add(EngineOutput(index=0, token_ids=(1, 2), prompt_tokens=12, completion_tokens=2, cached_tokens=8))
    tally.add(EngineOutput(index=1, token_ids=(3,), prompt_tokens=12, completion_tokens=1, cached_tokens=8))
    tally.add(EngineOutput(index=0, prompt_tokens=12, completion_tokens=5, reasoning_tokens=3, finish=DONE))
    tally.add(EngineOutput(index=1, prompt_tokens=12, completion_tokens=4, finish=DONE))
    assert usage_json(tally.usage()) == {
        "prompt_tokens": 12,
        "completion_tokens": 9,
        "total_tokens": 21,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }


def test_speculative_counters_only_when_drafts_were_reported() -> None:
    tally = UsageTally(4)
    tally.add(EngineOutput(completion_tokens=6, finish=DONE))
    assert "completion_tokens_details" not in usage_json(tally.usage())
    tally.add(EngineOutput(index=1, completion_tokens=6, finish=DONE, spec_draft_tokens=10, spec_accepted_tokens=7))
    details = usage_json(tally.usage())["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": 7, "rejected_prediction_tokens": 3}


def test_the_gateways_reasoning_count_per_choice_stands_beside_the_engines() -> None:
    """Reasoning tokens per choice: the gateway's count (its reasoning parser's) or the engine's,
    the higher one; summed over the choices."""
    tally = UsageTally(4)
    tally.add(EngineOutput(index=0, token_ids=(1, 2), completion_tokens=2), 2)
    tally.add(EngineOutput(index=1, token_ids=(3,), completion_tokens=1, reasoning_tokens=5), 1)
    tally.add(EngineOutput(index=0, token_ids=(4,), completion_tokens=3, finish=DONE), 3)
    tally.add(EngineOutput(index=1, completion_tokens=6, finish=DONE), 1)
    assert tally.usage().reasoning_tokens == 3 + 5

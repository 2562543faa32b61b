"""The neutral request as vLLM's EngineCoreRequest (what the front end would have filled in from the
tokenizer, filled in by the gateway) and a finished output as a neutral Finish."""

from __future__ import annotations

import msgspec
import pytest

from inference.upstreams.engine import Constraint, ConstraintKind, EngineRequest, FinishReason, SamplingParams
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.zmq import codec
from inference.upstreams.zmq.requests import engine_core_request, finish_of


def _wire(request: EngineRequest, index: int = 0, **options: object) -> list[object]:
    settings: dict[str, object] = {"eos_token_ids": (2,), "max_model_len": 100, **options}
    message = engine_core_request(request, request.request_id, index, **settings)  # type: ignore[arg-type]
    wire = msgspec.msgpack.decode(codec.encode(message))
    assert isinstance(wire, list)
    return wire


def test_sampling_values_reach_the_map() -> None:
    sampling = SamplingParams(temperature=0.0, top_k=-1, top_p=0.5, seed=7, min_new_tokens=2, logit_bias=((5, -1.5),))
    wire = _wire(EngineRequest("r", (1, 2, 3), sampling), index=1)
    params = wire[3]
    assert isinstance(params, dict)
    assert params["temperature"] == 0.0  # greedy is sent, not left to a default
    assert "top_k" not in params  # the neutral -1 is vLLM's 0, its default
    assert params["top_p"] == 0.5 and params["min_tokens"] == 2
    assert params["seed"] == 8  # a choice's seed: the request's plus its index, as vLLM fans out n
    assert params["logit_bias"] == {5: -1.5}
    assert params["max_tokens"] == 97  # the rest of the context window


def test_max_tokens_is_clamped_and_an_oversized_prompt_refused() -> None:
    assert _wire(EngineRequest("r", (1,) * 10, SamplingParams(max_new_tokens=5)))[3]["max_tokens"] == 5  # type: ignore[index]
    assert _wire(EngineRequest("r", (1,) * 98, SamplingParams(max_new_tokens=5)))[3]["max_tokens"] == 2  # type: ignore[index]
    assert _wire(EngineRequest("r", (1,), SamplingParams(max_new_tokens=5)), max_model_len=None)[3]["max_tokens"] == 5  # type: ignore[index]
    with pytest.raises(UpstreamFailure) as refused:
        _wire(EngineRequest("r", (1,) * 100))
    assert refused.value.rejected


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "object"}'), {"json": '{"type": "object"}'}),
        (Constraint(ConstraintKind.REGEX, "[a-z]+"), {"regex": "[a-z]+"}),
        (Constraint(ConstraintKind.GRAMMAR, "root ::= 'a'"), {"grammar": "root ::= 'a'"}),
        (Constraint(ConstraintKind.CHOICE, ("yes", "no")), {"choice": ["yes", "no"]}),
        (Constraint(ConstraintKind.JSON_OBJECT), {"json_object": True}),
        (Constraint(ConstraintKind.STRUCTURAL_TAG, '{"x": 1}'), {"structural_tag": '{"x": 1}'}),
    ],
)
def test_constraints_are_structured_outputs(constraint: Constraint, expected: dict[str, object]) -> None:
    params = _wire(EngineRequest("r", (1,), SamplingParams(constraint=constraint)))[3]
    assert isinstance(params, dict) and params["structured_outputs"] == expected


def test_eos_ids_and_the_dp_fields() -> None:
    wire = _wire(EngineRequest("r", (1,), data_parallel_rank=1), eos_token_ids=(2, 3, 4), current_wave=5)
    assert wire[5] == 2 and wire[9] == 1 and wire[12] == 5
    params = wire[3]
    assert isinstance(params, dict)
    assert params["stop_token_ids"] == [3, 4] and params["_eos_token_id"] == 2
    assert params["_all_stop_token_ids"] == [2, 3, 4]


def test_finish_reasons() -> None:
    def output(reason: int, tokens: list[int], stop: int | str | None = None) -> codec.EngineCoreOutput:
        return codec.EngineCoreOutput("r", tokens, finish_reason=reason, stop_reason=stop)

    assert finish_of(output(0, [5, 2]), (2,)).matched_token_id == 2  # EOS: no stop reason, the last token
    assert finish_of(output(0, [5, 9], 9), (2,)).matched_token_id == 9
    assert finish_of(output(0, [5], "END"), (2,)).matched_stop_str == "END"
    assert finish_of(output(0, [5]), (2,)).matched_token_id is None
    assert finish_of(output(1, [5]), (2,)).reason is FinishReason.LENGTH
    assert finish_of(output(2, []), (2,)).reason is FinishReason.ABORT

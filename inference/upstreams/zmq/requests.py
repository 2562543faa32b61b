"""From the neutral :class:`EngineRequest` to vLLM's EngineCoreRequest, and from a finished
EngineCoreOutput back to a neutral :class:`Finish`: what vLLM's front end would fill in from the
tokenizer and generation config (EOS ids, the stop ids, max_tokens within the context window), the
gateway fills in, as the engine core has no tokenizer."""

from __future__ import annotations

import time

from common import tracing
from inference.upstreams.engine import ConstraintKind, EngineRequest, Finish, FinishReason
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.zmq import codec

__all__ = ["engine_core_request", "finish_of"]


def engine_core_request(
    request: EngineRequest,
    request_id: str,
    index: int,
    *,
    eos_token_ids: tuple[int, ...],
    max_model_len: int | None,
    current_wave: int = 0,
    client_index: int = 0,
) -> codec.EngineCoreRequest:
    """The EngineCoreRequest of choice ``index`` of ``request`` (engine request id ``request_id``),
    from client ``client_index`` (the engine sends its outputs to that client's output address).
    ``UpstreamFailure.refused`` for a prompt that does not fit ``max_model_len``."""
    s = request.sampling
    prompt_len = len(request.input_ids)
    limit = max_model_len
    max_tokens = s.max_new_tokens
    if limit is not None:
        if prompt_len >= limit:
            raise UpstreamFailure.refused(
                f"the prompt ({prompt_len} tokens) does not fit the context length {limit}"
            )
        max_tokens = limit - prompt_len if max_tokens is None else min(max_tokens, limit - prompt_len)
    eos = eos_token_ids[0] if eos_token_ids else None
    stop_ids = list(s.stop_token_ids)
    if not s.ignore_eos:
        stop_ids += [token for token in eos_token_ids[1:] if token not in stop_ids]
    top = s.top_logprobs if (s.logprobs or s.top_logprobs) else None
    params = codec.SamplingParams(
        n=1,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=max(0, s.top_k),
        min_p=s.min_p,
        seed=None if s.seed is None else s.seed + index,
        stop_token_ids=stop_ids or None,
        ignore_eos=s.ignore_eos,
        max_tokens=max_tokens,
        min_tokens=s.min_new_tokens,
        logprobs=top,
        prompt_logprobs=s.top_logprobs if request.return_prompt_logprobs else None,
        detokenize=False,
        skip_special_tokens=s.skip_special_tokens,
        spaces_between_special_tokens=s.spaces_between_special_tokens,
        output_kind=1,  # delta: the engine core sends new tokens only anyway
        _eos_token_id=eos,
        _all_stop_token_ids=sorted(set(stop_ids) | ({eos} if eos is not None else set())),
        structured_outputs=_structured(request),
        logit_bias={token: bias for token, bias in s.logit_bias} or None,
    )
    return codec.EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=list(request.input_ids),
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        eos_token_id=eos,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=request.data_parallel_rank,
        client_index=client_index,
        current_wave=current_wave,
        trace_headers=tracing.trace_headers(),  # --enable-trace: the gateway's span as the engine's parent (D74)
    )


def finish_of(output: codec.EngineCoreOutput, eos_token_ids: tuple[int, ...]) -> Finish:
    """A finished output's :class:`Finish`: stop (a stop token id as ``stop_reason``, an EOS as the last
    token), length or abort. (Error is no finish: the client raises.)"""
    reason = output.finish_reason
    if reason == codec.WireFinishReason.LENGTH:
        return Finish(FinishReason.LENGTH)
    if reason == codec.WireFinishReason.ABORT:
        return Finish(FinishReason.ABORT)
    stop = output.stop_reason
    if isinstance(stop, int):
        return Finish(FinishReason.STOP, matched_token_id=stop)
    if isinstance(stop, str):
        return Finish(FinishReason.STOP, matched_stop_str=stop)
    last = output.new_token_ids[-1] if output.new_token_ids else None
    return Finish(FinishReason.STOP, matched_token_id=last if last in eos_token_ids else None)


def _structured(request: EngineRequest) -> codec.StructuredOutputsParams | None:
    constraint = request.sampling.constraint
    if constraint is None:
        return None
    kind, value = constraint.kind, constraint.value
    if kind is ConstraintKind.CHOICE:
        assert isinstance(value, tuple)
        return codec.StructuredOutputsParams(choice=list(value))
    if kind is ConstraintKind.JSON_OBJECT:
        return codec.StructuredOutputsParams(json_object=True)
    assert isinstance(value, str)
    if kind is ConstraintKind.JSON_SCHEMA:
        return codec.StructuredOutputsParams(json=value)
    if kind is ConstraintKind.REGEX:
        return codec.StructuredOutputsParams(regex=value)
    if kind is ConstraintKind.GRAMMAR:
        return codec.StructuredOutputsParams(grammar=value)
    return codec.StructuredOutputsParams(structural_tag=value)

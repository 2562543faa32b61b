"""vLLM's engine service (``vllm.grpc.engine.VllmEngine``): the codec between the neutral engine
types and its messages.

Differences from SGLang that matter here: ``temperature`` and ``max_tokens`` are proto3-optional
(an explicit 0.0 is greedy), ``top_k`` is unsigned (0 means no top-k, so the neutral -1 is sent as
0), logprobs are ``sampling_params.logprobs`` (the number of alternatives; 0 = only the sampled
token's) and prompt logprobs ``prompt_logprobs``, a ``choice`` constraint and ``json_object`` exist
natively, Abort takes a list of ids, and chunks report each chunk's own completion count (the
client accumulates). The responses carry no request id. Embed takes the same tokenized input.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
import orjson

from inference.routing.workers import Transport
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    EngineKey,
    ConstraintKind,
    EmbedRequest,
    EmbedResult,
    EngineRequest,
)
from inference.upstreams.grpc.client import (
    GrpcEngineClient,
    WireChunk,
    WireComplete,
    input_logprobs,
    output_logprobs,
    tokenized,
)
from inference.upstreams.grpc.wire import chunk_table
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from protos.vllm_engine_pb2_grpc import VllmEngineAsyncStub

__all__ = ["VllmClient"]


@ENGINE_CLIENTS.register(EngineKey(Transport.GRPC, "vllm"))
class VllmClient(GrpcEngineClient[pb.GenerateResponse]):
    runtime = "vllm"
    counts_cumulative = False
    messages: ClassVar[ModuleType] = pb
    wire_table = chunk_table(pb)  # its usual chunk read from the bytes (D110)

    @property
    def stub(self) -> VllmEngineAsyncStub:
        return self._stub_on(lambda channel: pb_grpc.VllmEngineStub(channel))

    def encode(self, request: EngineRequest) -> pb.GenerateRequest:
        s = request.sampling
        params = pb.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=max(0, s.top_k),
            min_p=s.min_p,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty,
            min_tokens=s.min_new_tokens,
            stop_token_ids=list(s.stop_token_ids),
            skip_special_tokens=s.skip_special_tokens,
            spaces_between_special_tokens=s.spaces_between_special_tokens,
            ignore_eos=s.ignore_eos,
            n=s.n,
            logit_bias={token: bias for token, bias in s.logit_bias},
        )
        if s.max_new_tokens is not None:
            params.max_tokens = s.max_new_tokens
        if s.logprobs or s.top_logprobs:
            params.logprobs = s.top_logprobs
        if request.return_prompt_logprobs:
            params.prompt_logprobs = s.top_logprobs
        if s.seed is not None:
            params.seed = s.seed % 2**31  # vLLM's seed is an int32 on this wire
        constraint = s.constraint
        if constraint is not None:
            if constraint.kind is ConstraintKind.CHOICE:
                assert isinstance(constraint.value, tuple)
                params.choice.CopyFrom(pb.ChoiceConstraint(choices=list(constraint.value)))
            elif constraint.kind is ConstraintKind.JSON_OBJECT:
                params.json_object = True
            else:
                assert isinstance(constraint.value, str)
                field = {
                    ConstraintKind.JSON_SCHEMA: "json_schema",
                    ConstraintKind.REGEX: "regex",
                    ConstraintKind.GRAMMAR: "grammar",
                    ConstraintKind.STRUCTURAL_TAG: "structural_tag",
                }[constraint.kind]
                setattr(params, field, constraint.value)
        message = tokenized(
            pb.GenerateRequest(request_id=request.request_id, sampling_params=params, stream=request.stream),
            request.input_ids,
            request.original_text,
        )
        if request.data_parallel_rank is not None:
            message.data_parallel_rank = request.data_parallel_rank
        kv = request.kv_transfer
        if kv is not None:
            if kv.json is not None:
                message.kv_transfer_params_json = kv.json
            if kv.remote_host is not None:
                message.kv_transfer_params.CopyFrom(
                    pb.KvTransferParams(remote_host=kv.remote_host, remote_port=kv.remote_port or 0)
                )
        return message

    def _decode(self, response: pb.GenerateResponse) -> WireChunk | WireComplete | None:
        kind = response.WhichOneof("response")
        if kind == "chunk":
            c = response.chunk
            return WireChunk(
                index=c.index,
                token_ids=tuple(c.token_ids),
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                cached_tokens=c.cached_tokens,
                logprobs=output_logprobs(c.output_logprobs) if c.HasField("output_logprobs") else None,
                prompt_logprobs=input_logprobs(c.input_logprobs) if c.HasField("input_logprobs") else None,
            )
        if kind == "complete":
            d = response.complete
            matched = d.WhichOneof("matched_stop")
            return WireComplete(
                index=d.index,
                output_ids=tuple(d.output_ids),
                finish_reason=d.finish_reason,
                prompt_tokens=d.prompt_tokens,
                completion_tokens=d.completion_tokens,
                cached_tokens=d.cached_tokens,
                matched_token_id=d.matched_token_id if matched == "matched_token_id" else None,
                matched_stop_str=d.matched_stop_str if matched == "matched_stop_str" else None,
                spec_accepted_tokens=d.spec_accepted_tokens,
                spec_draft_tokens=d.spec_draft_tokens,
                logprobs=output_logprobs(d.output_logprobs) if d.HasField("output_logprobs") else None,
                prompt_logprobs=input_logprobs(d.input_logprobs) if d.HasField("input_logprobs") else None,
                kv_transfer_params=_kv_params(d),
            )
        return None

    async def _send_abort(self, request_id: str, reason: str) -> None:
        await self.stub.Abort(
            pb.AbortRequest(request_ids=[request_id]), metadata=self.metadata, timeout=self.control_timeout
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        return await self._embed(
            tokenized(pb.EmbedRequest(request_id=request.request_id), request.input_ids, request.original_text)
        )


def _kv_params(complete: pb.GenerateComplete) -> str | None:
    """The KV handoff a prefill engine returned, as JSON text: the JSON field as sent, else the
    typed host and port in it."""
    if complete.HasField("kv_transfer_params_json"):
        return complete.kv_transfer_params_json
    if complete.HasField("kv_transfer_params"):
        typed = complete.kv_transfer_params
        return orjson.dumps({"remote_host": typed.remote_host, "remote_port": typed.remote_port}).decode()
    return None

"""vLLM's engine service (``vllm.grpc.engine.VllmEngine``): the codec between the neutral engine
types and its messages.

Differences from SGLang that matter here: ``temperature`` and ``max_tokens`` are proto3-optional
(an explicit 0.0 is greedy), ``top_k`` is unsigned (0 means no top-k, so the neutral -1 is sent as
0), logprobs are ``sampling_params.logprobs`` (the number of alternatives; 0 = only the sampled
token's) and prompt logprobs ``prompt_logprobs``, a ``choice`` constraint and ``json_object`` exist
natively, Abort takes a list of ids, and chunks report each chunk's own completion count (the
client accumulates). The responses carry no request id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.json_format import MessageToDict

from inference.routing.load_report import EngineLoad
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    CommandResult,
    ConstraintKind,
    EngineHealth,
    EngineRequest,
    ModelInfo,
    ProfileOptions,
    TokenizerBundle,
)
from inference.upstreams.grpc.client import (
    GrpcEngineClient,
    WireChunk,
    WireComplete,
    input_logprobs,
    output_logprobs,
    scheduler_load,
)
from inference.upstreams.grpc.sglang import profile_request
from protos import common_pb2
from protos import vllm_engine_pb2 as pb
from protos import vllm_engine_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from protos.vllm_engine_pb2_grpc import VllmEngineAsyncStub

__all__ = ["VllmClient"]


@ENGINE_CLIENTS.register("vllm")
class VllmClient(GrpcEngineClient[pb.GenerateResponse]):
    runtime = "vllm"
    counts_cumulative = False

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
        message = pb.GenerateRequest(
            request_id=request.request_id,
            tokenized=pb.TokenizedInput(original_text=request.original_text or "", input_ids=list(request.input_ids)),
            sampling_params=params,
            stream=request.stream,
        )
        if request.data_parallel_rank is not None:
            message.data_parallel_rank = request.data_parallel_rank
        return message

    def _open_generate(self, request: EngineRequest) -> grpc.aio.UnaryStreamCall[Any, pb.GenerateResponse]:
        return self.stub.Generate(self.encode(request), metadata=self.metadata)

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
                logprobs=output_logprobs(d.output_logprobs) if d.HasField("output_logprobs") else None,
                prompt_logprobs=input_logprobs(d.input_logprobs) if d.HasField("input_logprobs") else None,
            )
        return None

    async def _send_abort(self, request_id: str, reason: str) -> None:
        await self.stub.Abort(
            pb.AbortRequest(request_ids=[request_id]), metadata=self.metadata, timeout=self.control_timeout
        )

    async def health(self) -> EngineHealth:
        answer = await self._control(
            "HealthCheck",
            lambda: self.stub.HealthCheck(pb.HealthCheckRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return EngineHealth(answer.healthy, answer.message)

    async def model_info(self) -> ModelInfo:
        m = await self._control(
            "GetModelInfo",
            lambda: self.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return ModelInfo(
            model_path=m.model_path,
            served_model_name=m.served_model_name,
            tokenizer_path=m.tokenizer_path,
            max_context_length=m.max_context_length or None,
            vocab_size=m.vocab_size or None,
            eos_token_ids=tuple(m.eos_token_ids),
            bos_token_id=m.bos_token_id or None,
            pad_token_id=m.pad_token_id or None,
            architectures=tuple(m.architectures),
            model_type=m.model_type,
            is_generation=m.is_generation,
            supports_vision=m.supports_vision,
            max_req_input_len=m.max_req_input_len or None,
        )

    async def server_info(self) -> dict[str, Any]:
        answer = await self._control(
            "GetServerInfo",
            lambda: self.stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return MessageToDict(answer, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)

    async def loads(self) -> tuple[EngineLoad, ...]:
        answer = await self._control(
            "GetLoads",
            lambda: self.stub.GetLoads(pb.GetLoadsRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return tuple(scheduler_load(load) for load in answer.loads)

    async def flush_cache(self) -> CommandResult:
        answer = await self._control(
            "FlushCache",
            lambda: self.stub.FlushCache(
                common_pb2.FlushCacheRequest(), metadata=self.metadata, timeout=self.control_timeout
            ),
        )
        return CommandResult(answer.success, answer.message)

    async def start_profile(self, options: ProfileOptions) -> CommandResult:
        answer = await self._control(
            "StartProfile",
            lambda: self.stub.StartProfile(profile_request(options), metadata=self.metadata, timeout=self.control_timeout),
        )
        return CommandResult(answer.success, answer.message)

    async def stop_profile(self) -> CommandResult:
        answer = await self._control(
            "StopProfile",
            lambda: self.stub.StopProfile(
                common_pb2.StopProfileRequest(), metadata=self.metadata, timeout=self.control_timeout
            ),
        )
        return CommandResult(answer.success, answer.message)

    async def tokenizer(self) -> TokenizerBundle:
        return await self._fetch_tokenizer(
            self.stub.GetTokenizer(common_pb2.GetTokenizerRequest(), metadata=self.metadata)
        )

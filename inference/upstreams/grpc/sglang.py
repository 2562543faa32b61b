"""SGLang's scheduler service (``sglang.grpc.scheduler.SglangScheduler``): the codec between the
neutral engine types and its messages.

Sent: token ids only (``tokenized.input_ids``, with the rendered prompt as ``original_text``), every
sampling value explicitly (proto3's 0 would mean greedy or "no top-p"), stop token ids (stop strings
are the gateway's), ``stream``, logprobs (``logprob_start_len`` -1 unless prompt logprobs are
asked for: SGLang reads 0 as "from the first prompt token"). Received: chunks with the new tokens
and cumulative counts, then one ``complete`` per choice.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.json_format import MessageToDict

from inference.routing.load_report import EngineLoad
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    CommandResult,
    Constraint,
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
from protos import common_pb2
from protos import sglang_scheduler_pb2 as pb
from protos import sglang_scheduler_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from protos.sglang_scheduler_pb2_grpc import SglangSchedulerAsyncStub

__all__ = ["SglangClient", "choice_regex", "profile_request", "sglang_constraint"]


def choice_regex(choices: tuple[str, ...]) -> str:
    """A regex matching exactly one of ``choices`` (for engines without a choice constraint)."""
    return "(" + "|".join(re.escape(choice) for choice in choices) + ")"


def sglang_constraint(constraint: Constraint) -> tuple[str, str]:
    """The ``constraint`` oneof member of SGLang's and TokenSpeed's SamplingParams, and its value
    (no choice or json_object there: a regex and a schema stand in)."""
    kind = constraint.kind
    if kind is ConstraintKind.CHOICE:
        assert isinstance(constraint.value, tuple)
        return "regex", choice_regex(constraint.value)
    if kind is ConstraintKind.JSON_OBJECT:
        return "json_schema", json.dumps({"type": "object"})
    assert isinstance(constraint.value, str)
    field = {
        ConstraintKind.JSON_SCHEMA: "json_schema",
        ConstraintKind.REGEX: "regex",
        ConstraintKind.GRAMMAR: "ebnf_grammar",
        ConstraintKind.STRUCTURAL_TAG: "structural_tag",
    }[kind]
    return field, constraint.value


def profile_request(options: ProfileOptions) -> common_pb2.StartProfileRequest:
    message = common_pb2.StartProfileRequest(
        activities=list(options.activities), profile_by_stage=options.profile_by_stage
    )
    if options.output_dir is not None:
        message.output_dir = options.output_dir
    if options.start_step is not None:
        message.start_step = options.start_step
    if options.num_steps is not None:
        message.num_steps = options.num_steps
    if options.with_stack is not None:
        message.with_stack = options.with_stack
    if options.record_shapes is not None:
        message.record_shapes = options.record_shapes
    return message


@ENGINE_CLIENTS.register("sglang")
class SglangClient(GrpcEngineClient[pb.GenerateResponse]):
    runtime = "sglang"
    counts_cumulative = True

    @property
    def stub(self) -> SglangSchedulerAsyncStub:
        return self._stub_on(lambda channel: pb_grpc.SglangSchedulerStub(channel))

    def encode(self, request: EngineRequest) -> pb.GenerateRequest:
        s = request.sampling
        params = pb.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty,
            stop_token_ids=list(s.stop_token_ids),
            skip_special_tokens=s.skip_special_tokens,
            spaces_between_special_tokens=s.spaces_between_special_tokens,
            n=s.n,
            min_new_tokens=s.min_new_tokens,
            ignore_eos=s.ignore_eos,
            logit_bias={str(token): bias for token, bias in s.logit_bias},
        )
        if s.constraint is not None:
            field, value = sglang_constraint(s.constraint)
            setattr(params, field, value)
        if s.max_new_tokens is not None:
            params.max_new_tokens = s.max_new_tokens
        message = pb.GenerateRequest(
            request_id=request.request_id,
            tokenized=pb.TokenizedInput(original_text=request.original_text or "", input_ids=list(request.input_ids)),
            sampling_params=params,
            return_logprob=s.logprobs or request.return_prompt_logprobs,
            logprob_start_len=0 if request.return_prompt_logprobs else -1,
            top_logprobs_num=s.top_logprobs,
            stream=request.stream,
        )
        if request.data_parallel_rank is not None:
            message.data_parallel_rank = request.data_parallel_rank
        if request.disaggregation is not None:
            d = request.disaggregation
            message.disaggregated_params.CopyFrom(
                pb.DisaggregatedParams(
                    bootstrap_host=d.bootstrap_host, bootstrap_port=d.bootstrap_port, bootstrap_room=d.bootstrap_room
                )
            )
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
                reasoning_tokens=c.reasoning_tokens,
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
                reasoning_tokens=d.reasoning_tokens,
                matched_token_id=d.matched_token_id if matched == "matched_token_id" else None,
                matched_stop_str=d.matched_stop_str if matched == "matched_stop_str" else None,
                logprobs=output_logprobs(d.output_logprobs) if d.HasField("output_logprobs") else None,
                prompt_logprobs=input_logprobs(d.input_logprobs) if d.HasField("input_logprobs") else None,
            )
        return None

    async def _send_abort(self, request_id: str, reason: str) -> None:
        await self.stub.Abort(
            pb.AbortRequest(request_id=request_id, reason=reason), metadata=self.metadata, timeout=self.control_timeout
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

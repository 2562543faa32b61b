"""SGLang's scheduler service (``sglang.grpc.scheduler.SglangScheduler``): the codec between the
neutral engine types and its messages.

Sent: token ids only (``tokenized.input_ids``, with the rendered prompt as ``original_text``), every
sampling value explicitly (proto3's 0 would mean greedy or "no top-p"), stop token ids (stop strings
are the gateway's), ``stream``, logprobs (``logprob_start_len`` -1 unless prompt logprobs are
asked for: SGLang reads 0 as "from the first prompt token"). Received: chunks with the new tokens
and cumulative counts, then one ``complete`` per choice. Embed takes the same tokenized input.
"""

from __future__ import annotations

import json
import re
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, cast

import grpc

from inference.routing.workers import Transport
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    EngineKey,
    Constraint,
    ConstraintKind,
    EmbedRequest,
    EmbedResult,
    EngineRequest,
)
from inference.upstreams.grpc.client import (
    ChunkFields,
    GrpcEngineClient,
    WireChunk,
    WireComplete,
    input_logprobs,
    output_logprobs,
    tokenized,
)
from inference.upstreams.grpc.wire import chunk_table, read_chunk
from protos import sglang_scheduler_pb2 as pb
from protos import sglang_scheduler_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from protos.sglang_scheduler_pb2_grpc import SglangSchedulerAsyncStub

__all__ = ["SglangClient", "choice_regex", "sglang_constraint"]


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


_TABLE = chunk_table(pb)


def read_generate_response(prefix: bytes, data: bytes) -> ChunkFields | pb.GenerateResponse:
    """One GenerateResponse off the wire: :func:`~.wire.read_chunk` with SGLang's table (a stream
    reads with the decode :meth:`SglangClient._wire_decode` makes once, D107)."""
    return read_chunk(_TABLE, prefix, data)


@ENGINE_CLIENTS.register(EngineKey(Transport.GRPC, "sglang"))
class SglangClient(GrpcEngineClient[pb.GenerateResponse]):
    runtime = "sglang"
    counts_cumulative = True
    messages: ClassVar[ModuleType] = pb

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
            sampling_params=params,
            return_logprob=s.logprobs or request.return_prompt_logprobs,
            logprob_start_len=0 if request.return_prompt_logprobs else -1,
            top_logprobs_num=s.top_logprobs,
            stream=request.stream,
        )
        tokenized(message, request.input_ids, request.original_text)
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

    reads_chunk_fields = True
    wire_table = _TABLE

    def _chunk_fields(self, response: pb.GenerateResponse) -> ChunkFields | None:
        # The chunk's fields in WireChunk's order (_decode builds its WireChunk from them).
        if response.WhichOneof("response") != "chunk":
            return None
        c = response.chunk
        return (
            c.index,
            tuple(c.token_ids),
            c.prompt_tokens,
            c.completion_tokens,
            c.cached_tokens,
            c.reasoning_tokens,
            output_logprobs(c.output_logprobs) if c.HasField("output_logprobs") else None,
            input_logprobs(c.input_logprobs) if c.HasField("input_logprobs") else None,
        )

    def _decode(self, response: pb.GenerateResponse) -> WireChunk | WireComplete | None:
        kind = response.WhichOneof("response")
        if kind == "chunk":
            # The fields _chunk_fields reads, in WireChunk's order (one place for the chunk's reads).
            return WireChunk(*cast(ChunkFields, self._chunk_fields(response)))
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
                spec_accepted_tokens=d.spec_accepted_tokens,
                spec_draft_tokens=d.spec_draft_tokens,
                logprobs=output_logprobs(d.output_logprobs) if d.HasField("output_logprobs") else None,
                prompt_logprobs=input_logprobs(d.input_logprobs) if d.HasField("input_logprobs") else None,
            )
        return None

    async def _send_abort(self, request_id: str, reason: str) -> None:
        await self.stub.Abort(
            pb.AbortRequest(request_id=request_id, reason=reason), metadata=self.metadata, timeout=self.control_timeout
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        message = tokenized(pb.EmbedRequest(request_id=request.request_id), request.input_ids, request.original_text)
        if request.data_parallel_rank is not None:
            message.data_parallel_rank = request.data_parallel_rank
        return await self._embed(message)

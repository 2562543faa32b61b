"""SGLang's scheduler service (``sglang.grpc.scheduler.SglangScheduler``): the codec between the
neutral engine types and its messages.

Sent: token ids only (``tokenized.input_ids``, with the rendered prompt as ``original_text``), every
sampling value explicitly (proto3's 0 would mean greedy or "no top-p"), stop token ids (stop strings
are the gateway's), ``stream``, logprobs (``logprob_start_len`` -1 unless prompt logprobs are
asked for: SGLang reads 0 as "from the first prompt token"). Received: chunks with the new tokens
and cumulative counts, then one ``complete`` per choice. Embed takes the same tokenized input.
"""

from __future__ import annotations

import functools
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


_PARSE = pb.GenerateResponse.FromString


def read_generate_response(prefix: bytes, data: bytes) -> ChunkFields | pb.GenerateResponse:
    """One GenerateResponse off the wire (the event-loop reader's decode, once per engine message): a
    chunk of the usual shape read straight from its bytes as its fields, in :class:`WireChunk`'s
    order (what :meth:`SglangClient._chunk_fields` reads from the parsed message); anything else
    parsed by protobuf (upb) as before.

    The usual shape, as SGLang's servicer sends it while it decodes: an ASCII ``request_id``
    (field 1), then one ``chunk`` (field 2) to the end, holding only packed ``token_ids`` and the
    counts and index (uint32 varints of at most 3 bytes: below 2**21), each length one byte. A
    logprob, hidden state, unknown field, repeated run, longer value or length, non-ASCII id or
    truncation goes to upb, which reads (or refuses) it as it always did. ``prefix`` is the field 1
    the request's own id makes (:meth:`SglangClient._wire_decode`), skipped without a copy.

    Reading the upb message's fields costs more than parsing it (about 13k instructions a chunk on
    CPython 3.11: an attribute lookup by name per field, the ids' container, ``WhichOneof`` and two
    ``HasField``; the parse 3k); this reads the ~20 bytes of a chunk in 10.8k, about half the time."""
    try:
        if data.startswith(prefix):  # the request's own id (field 1), as the engine echoes it
            at = len(prefix)
        elif data[0] == 0x0A:  # another request_id
            length = data[1]
            if length >= 0x80 or not data[2 : 2 + length].isascii():
                return _PARSE(data)
            at = 2 + length
        else:
            at = 0
        size = len(data)
        length = data[at + 1]
        if data[at] != 0x12 or length >= 0x80 or at + 2 + length != size:
            return _PARSE(data)  # not one chunk to the end
        at += 2
        ids: tuple[int, ...] | None = None
        prompt = completion = cached = index = reasoning = 0
        while at < size:
            tag = data[at]
            if tag == 0x0A:  # token_ids, packed
                length = data[at + 1]
                if ids is not None or length >= 0x80 or not length:
                    return _PARSE(data)  # a second run (concatenated), a long or an empty one
                at += 2
                end = at + length
                found: list[int] | None = None
                while True:
                    value = data[at]
                    if value < 0x80:
                        at += 1
                    else:
                        second = data[at + 1]
                        if second < 0x80:
                            value = (value & 0x7F) | second << 7
                            at += 2
                        else:
                            third = data[at + 2]
                            if third >= 0x80:
                                return _PARSE(data)
                            value = (value & 0x7F) | (second & 0x7F) << 7 | third << 14
                            at += 3
                    if at >= end:
                        break
                    if found is None:
                        found = [value]
                    else:
                        found.append(value)
                if at != end:
                    return _PARSE(data)
                if found is None:  # one token: the usual chunk while an engine decodes
                    ids = (value,)
                else:
                    found.append(value)
                    ids = tuple(found)
                continue
            value = data[at + 1]
            if value < 0x80:
                at += 2
            else:
                second = data[at + 2]
                if second < 0x80:
                    value = (value & 0x7F) | second << 7
                    at += 3
                else:
                    third = data[at + 3]
                    if third >= 0x80:
                        return _PARSE(data)
                    value = (value & 0x7F) | (second & 0x7F) << 7 | third << 14
                    at += 4
            if tag == 0x18:
                completion = value
            elif tag == 0x10:
                prompt = value
            elif tag == 0x40:
                index = value
            elif tag == 0x20:
                cached = value
            elif tag == 0x48:
                reasoning = value
            else:  # logprobs, hidden states, an unknown field
                return _PARSE(data)
        if at != size:
            return _PARSE(data)
    except IndexError:  # truncated: upb says how
        return _PARSE(data)
    return (index, () if ids is None else ids, prompt, completion, cached, reasoning, None, None)


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

    def _wire_decode(self, request: EngineRequest) -> Callable[[bytes], Any] | None:
        request_id = request.request_id.encode()
        if not request.stream or len(request_id) >= 0x80:
            return None  # a whole answer is one complete message: the reply's parser reads it
        return functools.partial(read_generate_response, b"\x0a" + bytes((len(request_id),)) + request_id)

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

"""TensorRT-LLM's service (``trtllm.TrtllmService``): the codec between the neutral engine types and
its messages.

Its shape differs from SGLang's more than the others': the prompt is ``tokenized.input_token_ids``;
sampling is a ``SamplingConfig`` (every knob proto3-optional, all sent; ``top_k`` 0 means no top-k,
so the neutral -1 is sent as 0; n is ``num_return_sequences``), logprobs an ``OutputConfig`` (the
number of alternatives, like vLLM's), a constraint ``guided_decoding`` (SGLang's mapping, as a guide
type); ``max_tokens`` is a plain uint32, so when the request sets none the engine's context length
(GetModelInfo, asked once per client) less the prompt is sent. Chunks carry ``sequence_index`` and
cumulative counts, logprobs as ``TokenLogprob`` lists; ``complete.output_token_ids`` holds every
token of the choice (the fold uses it only when nothing was streamed). HealthCheck answers a status
word ("OK"), not a flag.

The service has no GetLoads, FlushCache or profiling RPCs (the base client raises
``UpstreamFailure`` for them). Requests it cannot carry raise ``UpstreamFailure`` too: a logit bias
(the engine takes a whole-vocabulary ``embedding_bias``) and SGLang-style bootstrap disaggregation
(TensorRT-LLM's PD hands over context-phase parameters instead).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, cast

import grpc

from inference.routing.workers import Transport
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    EngineKey,
    EmbedRequest,
    EmbedResult,
    EngineHealth,
    EngineOutput,
    EngineRequest,
    ModelInfo,
    TokenLogprobs,
)
from inference.upstreams.grpc.channel import WorkerChannel
from inference.upstreams.grpc.client import GrpcEngineClient, WireChunk, WireComplete, tokenized
from inference.upstreams.grpc.sglang import sglang_constraint
from inference.upstreams.grpc.wire import chunk_table
from protos import trtllm_service_pb2 as pb
from protos import trtllm_service_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from protos.trtllm_service_pb2_grpc import TrtllmServiceAsyncStub

__all__ = ["DEFAULT_MAX_TOKENS", "TrtllmClient", "token_logprobs"]

DEFAULT_MAX_TOKENS = 2048
"""``max_tokens`` when the request sets none and the engine reports no context length (the
reference gateway's default)."""

HEALTHY_STATUSES = frozenset({"ok", "healthy", "serving"})

_GUIDE_TYPES = {
    "json_schema": pb.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA,
    "regex": pb.GuidedDecodingParams.GUIDE_TYPE_REGEX,
    "ebnf_grammar": pb.GuidedDecodingParams.GUIDE_TYPE_EBNF_GRAMMAR,
    "structural_tag": pb.GuidedDecodingParams.GUIDE_TYPE_STRUCTURAL_TAG,
}


def token_logprobs(entries: Iterable[pb.TokenLogprob]) -> tuple[TokenLogprobs, ...] | None:
    """TensorRT-LLM's ``repeated TokenLogprob`` (one per token, its alternatives inside); None when
    empty."""
    found = tuple(
        TokenLogprobs(
            int(entry.token_id),
            float(entry.logprob),
            tuple((int(top.token_id), float(top.logprob)) for top in entry.top_logprobs),
        )
        for entry in entries
    )
    return found or None


@ENGINE_CLIENTS.register(EngineKey(Transport.GRPC, "trtllm"))
class TrtllmClient(GrpcEngineClient[pb.GenerateResponse]):
    runtime = "trtllm"
    counts_cumulative = True
    messages: ClassVar[ModuleType] = pb
    wire_table = chunk_table(pb, index="sequence_index")  # its usual chunk read from the bytes (D110)

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        channel: WorkerChannel | None = None,
        control_timeout: float = 30.0,
    ) -> None:
        super().__init__(url, api_key=api_key, channel=channel, control_timeout=control_timeout)
        self._context_length: int | None = None  # the engine's, once asked (0: it reports none)

    @property
    def stub(self) -> TrtllmServiceAsyncStub:
        return self._stub_on(lambda channel: pb_grpc.TrtllmServiceStub(channel))

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """As :meth:`GrpcEngineClient.generate`; first learns the context length (once) when the
        request sets no ``max_new_tokens``."""
        if request.sampling.max_new_tokens is None and self._context_length is None:
            self._context_length = (await self.model_info()).max_context_length or 0
        outputs = cast(AsyncGenerator[EngineOutput, None], super().generate(request))
        async with aclosing(outputs):  # closing this generator closes (and aborts) the inner one now
            async for output in outputs:
                yield output

    def max_tokens(self, request: EngineRequest) -> int:
        """The ``max_tokens`` to send: the request's, else what the context leaves after the prompt."""
        if request.sampling.max_new_tokens is not None:
            return request.sampling.max_new_tokens
        if self._context_length:
            return max(1, self._context_length - len(request.input_ids))
        return DEFAULT_MAX_TOKENS

    def encode(self, request: EngineRequest) -> pb.GenerateRequest:
        s = request.sampling
        if s.logit_bias:
            raise self.unsupported("logit_bias (it takes a whole-vocabulary embedding_bias)")
        if request.disaggregation is not None:
            raise self.unsupported("bootstrap disaggregation")
        config = pb.SamplingConfig(
            beam_width=1,
            num_return_sequences=s.n,
            top_k=max(0, s.top_k),
            top_p=s.top_p,
            temperature=s.temperature,
            min_p=s.min_p,
            min_tokens=s.min_new_tokens,
            repetition_penalty=s.repetition_penalty,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
        )
        if s.seed is not None:
            config.seed = s.seed % 2**64  # an unsigned 64-bit seed on this wire
        output = pb.OutputConfig(exclude_input_from_output=True)
        if s.logprobs or s.top_logprobs:
            output.logprobs = s.top_logprobs
        if request.return_prompt_logprobs:
            output.prompt_logprobs = s.top_logprobs
        message = pb.GenerateRequest(
            request_id=request.request_id,
            sampling_config=config,
            output_config=output,
            max_tokens=self.max_tokens(request),
            streaming=request.stream,
            stop_token_ids=list(s.stop_token_ids),
            ignore_eos=s.ignore_eos,
        )
        tokenized(message, request.input_ids, request.original_text, ids_field="input_token_ids")
        if s.constraint is not None:
            field, value = sglang_constraint(s.constraint)
            message.guided_decoding.CopyFrom(pb.GuidedDecodingParams(guide_type=_GUIDE_TYPES[field], guide=value))
        return message

    def _decode(self, response: pb.GenerateResponse) -> WireChunk | WireComplete | None:
        kind = response.WhichOneof("response")
        if kind == "chunk":
            c = response.chunk
            return WireChunk(
                index=c.sequence_index,
                token_ids=tuple(c.token_ids),
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                cached_tokens=c.cached_tokens,
                logprobs=token_logprobs(c.logprobs),
            )
        if kind == "complete":
            d = response.complete
            matched = d.WhichOneof("matched_stop")
            return WireComplete(
                index=d.sequence_index,
                output_ids=tuple(d.output_token_ids),
                finish_reason=d.finish_reason,
                prompt_tokens=d.prompt_tokens,
                completion_tokens=d.completion_tokens,
                cached_tokens=d.cached_tokens,
                matched_token_id=d.matched_token_id if matched == "matched_token_id" else None,
                matched_stop_str=d.matched_stop_str if matched == "matched_stop_str" else None,
                spec_accepted_tokens=d.spec_accepted_tokens,
                spec_draft_tokens=d.spec_draft_tokens,
                logprobs=token_logprobs(d.logprobs),
                prompt_logprobs=token_logprobs(d.prompt_logprobs),
            )
        return None

    async def _send_abort(self, request_id: str, reason: str) -> None:
        await self.stub.Abort(pb.AbortRequest(request_id=request_id), metadata=self.metadata, timeout=self.control_timeout)

    async def health(self) -> EngineHealth:
        answer = await self._control(
            "HealthCheck",
            lambda: self.stub.HealthCheck(pb.HealthCheckRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return EngineHealth(answer.status.strip().lower() in HEALTHY_STATUSES, answer.status)

    async def model_info(self) -> ModelInfo:
        m = await self._control(
            "GetModelInfo",
            lambda: self.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=self.metadata, timeout=self.control_timeout),
        )
        return ModelInfo(
            model_path=m.model_id,
            max_context_length=m.max_seq_len or m.max_input_len or None,
            vocab_size=m.vocab_size or None,
            max_req_input_len=m.max_input_len or None,
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        return await self._embed(
            tokenized(
                pb.EmbedRequest(request_id=request.request_id), request.input_ids, request.original_text,
                ids_field="input_token_ids",
            )
        )

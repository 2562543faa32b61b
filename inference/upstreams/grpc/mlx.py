"""The MLX engine's service (``mlx.grpc.engine.MlxEngine``, Apple silicon): the codec between the
neutral engine types and its messages.

vLLM's shape in small: ``temperature`` and ``max_tokens`` proto3-optional (an explicit 0.0 is
greedy), ``top_k`` unsigned (the neutral -1 is sent as 0, no top-k), ``logprobs`` the number of
alternatives, a 32-bit ``seed``, Abort by a list of ids; chunks report each chunk's own completion
count (the client accumulates) and no request id; ``complete`` names only the stop token that ended
the sample (``matched_stop_token_id``).

The service has only Generate, HealthCheck, Abort, GetModelInfo, GetServerInfo and GetTokenizer:
loads, cache flush, profiling and Embed raise ``UpstreamFailure``. So do requests the engine cannot
honour: n > 1 (it has no parallel samples), a structured-output constraint, ``min_new_tokens``,
prompt logprobs and disaggregation.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import grpc

from inference.routing.workers import Transport
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    EngineKey,
    EngineRequest,
)
from inference.upstreams.grpc.client import (
    GrpcEngineClient,
    WireChunk,
    WireComplete,
    output_logprobs,
    tokenized,
)
from inference.upstreams.grpc.wire import chunk_table
from protos import mlx_engine_pb2 as pb
from protos import mlx_engine_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from protos.mlx_engine_pb2_grpc import MlxEngineAsyncStub

__all__ = ["MlxClient"]


@ENGINE_CLIENTS.register(EngineKey(Transport.GRPC, "mlx"))
class MlxClient(GrpcEngineClient[pb.GenerateResponse]):
    runtime = "mlx"
    counts_cumulative = False
    messages: ClassVar[ModuleType] = pb
    wire_table = chunk_table(pb)  # its usual chunk read from the bytes (D110)

    @property
    def stub(self) -> MlxEngineAsyncStub:
        return self._stub_on(lambda channel: pb_grpc.MlxEngineStub(channel))

    def _refuse_what_it_lacks(self, request: EngineRequest) -> None:
        s = request.sampling
        if s.n > 1:
            raise self.unsupported("n > 1 (parallel samples)")
        if s.constraint is not None:
            raise self.unsupported(f"structured output ({s.constraint.kind.value} constraint)")
        if s.min_new_tokens:
            raise self.unsupported("min_new_tokens")
        if request.return_prompt_logprobs:
            raise self.unsupported("prompt logprobs")
        if request.disaggregation is not None:
            raise self.unsupported("disaggregation")

    def encode(self, request: EngineRequest) -> pb.GenerateRequest:
        self._refuse_what_it_lacks(request)
        s = request.sampling
        params = pb.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=max(0, s.top_k),
            min_p=s.min_p,
            repetition_penalty=s.repetition_penalty,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            logit_bias={token: bias for token, bias in s.logit_bias},
            stop_token_ids=list(s.stop_token_ids),
            ignore_eos=s.ignore_eos,
        )
        if s.max_new_tokens is not None:
            params.max_tokens = s.max_new_tokens
        if s.logprobs or s.top_logprobs:
            params.logprobs = s.top_logprobs
        if s.seed is not None:
            params.seed = s.seed % 2**31  # a signed 32-bit seed on this wire
        return tokenized(
            pb.GenerateRequest(request_id=request.request_id, sampling_params=params, stream=request.stream),
            request.input_ids,
            request.original_text,
        )

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
            )
        if kind == "complete":
            d = response.complete
            return WireComplete(
                index=d.index,
                output_ids=tuple(d.output_ids),
                finish_reason=d.finish_reason,
                prompt_tokens=d.prompt_tokens,
                completion_tokens=d.completion_tokens,
                cached_tokens=d.cached_tokens,
                matched_token_id=d.matched_stop_token_id if d.HasField("matched_stop_token_id") else None,
                logprobs=output_logprobs(d.output_logprobs) if d.HasField("output_logprobs") else None,
            )
        return None

    async def _send_abort(self, request_id: str, reason: str) -> None:
        await self.stub.Abort(
            pb.AbortRequest(request_ids=[request_id]), metadata=self.metadata, timeout=self.control_timeout
        )

"""POST /v1/embeddings on engine workers: each input tokenized by the gateway (with the model's
special tokens, as the engines do) and embedded by the engine's Embed RPC, all inputs at once.

Input: a string, an array of strings, token ids, or an array of token-id arrays; ``encoding_format``
``float`` (default) or ``base64`` (little-endian float32, as OpenAI sends it); ``dimensions`` keeps
the first that many values. Answer: ``{object: list, data: [{object: embedding, index, embedding}],
model, usage: {prompt_tokens, total_tokens}}``.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import uuid
from typing import Any

import orjson

from inference import errors
from inference.accounting import Delivered, TokenUsage
from inference.pipeline.prompt import check_prompt, tokenize
from inference.routing.workers import WorkerHandle
from inference.served.base import LocalAnswer, ServedRequest, ServedSurface, engine_target
from inference.upstreams.deadline import Deadline
from inference.upstreams.engine import EmbedRequest, EmbedResult, EngineClient
from inference.upstreams.failures import FailureKind, UpstreamFailure

__all__ = ["ServedEmbeddings", "embedding_inputs"]


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(item) is int and item >= 0 for item in value)


def embedding_inputs(value: Any) -> list[str | list[int]]:
    """The inputs of an ``input`` field; 400 for anything else (an empty string or array included)."""
    if isinstance(value, str) and value:
        return [value]
    if _ids(value):
        return [value]
    if isinstance(value, list) and value and all((isinstance(item, str) and item) or _ids(item) for item in value):
        return list(value)
    raise errors.invalid_request(
        "input must be a non-empty string, an array of non-empty strings, token IDs, or arrays of token IDs", "input"
    )


def _encoded(vector: tuple[float, ...], encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return list(vector)


class ServedEmbeddings(ServedSurface):
    def __init__(self, request: ServedRequest) -> None:
        super().__init__(request)
        body = request.body
        self.inputs = embedding_inputs(body.get("input"))
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise errors.invalid_request("encoding_format must be float or base64", "encoding_format")
        self.encoding = str(encoding)
        dimensions = body.get("dimensions")
        if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
            raise errors.invalid_request("dimensions must be a positive integer", "dimensions")
        self.dimensions: int | None = dimensions
        self.id = f"embd-{uuid.uuid4().hex}"

    async def open(self, worker: WorkerHandle) -> LocalAnswer:
        target = engine_target(self.request.dp, worker, self.request.model)
        if not target.client.offers("Embed"):
            over = worker.record.transport.display_name
            raise errors.endpoint_not_supported("/v1/embeddings", f"{target.client.runtime} {over}")
        vocab = target.tokenizer.vocab_size
        requests = []
        for index, item in enumerate(self.inputs):
            if isinstance(item, str):
                ids = await tokenize(target.tokenizer, item, add_special_tokens=True)
            else:
                if any(token >= vocab for token in item):
                    raise errors.invalid_request(f"input token IDs must be below the vocabulary size {vocab}", "input")
                ids = tuple(item)
            check_prompt(len(ids), target.spec.context_length, "input")
            text = item if isinstance(item, str) else None
            requests.append(EmbedRequest(f"{self.id}-{index}", ids, text, data_parallel_rank=worker.dp_rank))
        results = await _embedded(target.client, requests, self.request.dp.config.request_timeout_secs)
        data = [
            {
                "object": "embedding",
                "index": index,
                "embedding": _encoded(result.embedding[: self.dimensions] if self.dimensions else result.embedding, self.encoding),
            }
            for index, result in enumerate(results)
        ]
        tokens = sum(result.prompt_tokens or len(request.input_ids) for result, request in zip(results, requests))
        answer = {
            "object": "list",
            "data": data,
            "model": self.request.model or self.request.requested_model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        # The request's accounting (D80): the prompt tokens the answer reports, as OpenAI's do.
        return LocalAnswer(orjson.dumps(answer), delivered=Delivered(True, TokenUsage(prompt=tokens)))


async def _embedded(client: EngineClient, requests: list[EmbedRequest], seconds: float) -> list[EmbedResult]:
    """Each request's embedding, at once, within --request-timeout-secs (D104): past it the calls
    are cancelled and the request fails as the relay's timeout does (504 upstream_timeout, or another worker)."""
    deadline = Deadline(asyncio.get_running_loop(), seconds)
    try:
        return list(await asyncio.gather(*(client.embed(r) for r in requests)))
    except asyncio.CancelledError:
        if deadline.absorb():
            raise UpstreamFailure(FailureKind.TIMEOUT, "timed out", seconds) from None
        raise
    finally:
        deadline.cancel()

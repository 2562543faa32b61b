"""POST /v1/messages/count_tokens on engine workers (spec 1, "Token counting"): counted by the gateway
with the model's tokenizer, from exactly the prompt POST /v1/messages would send (the same mapper,
render and tokenize as :class:`~inference.pipeline.chat_turn.ChatTurn`): ``{"input_tokens": N}``.
No engine call.

Refusals: the tokenizer still loading 503 tokenizer_not_ready (Retry-After: 1), none to be had 500
tokenizer_not_found, a request that does not render (a document without text included) 400
process_messages_failed, an encode failure 500 tokenization_failed.
"""

from __future__ import annotations

import orjson

from inference.pipeline.prompt import render_turn, tokenize
from inference.routing.workers import WorkerHandle
from inference.schemas.messages import MessagesRequest
from inference.served.base import LocalAnswer, ServedSurface, engine_target
from inference.served.messages_turn import messages_turn

__all__ = ["ServedCountTokens"]


class ServedCountTokens(ServedSurface):
    async def open(self, worker: WorkerHandle) -> LocalAnswer:
        request = self.request
        parsed: MessagesRequest = request.parsed
        target = engine_target(request.dp, worker, request.model)
        rendered = render_turn(messages_turn(parsed, target.model, stream=False), target.tokenizer, target.family)
        ids = await tokenize(target.tokenizer, rendered.text)
        return LocalAnswer(orjson.dumps({"input_tokens": len(ids)}))

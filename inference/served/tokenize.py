"""POST /v1/tokenize and /v1/detokenize on engine workers, with the gateway's own tokenizer of the
model (SGLang's bodies, ENGINES.md): ``{model, prompt, add_special_tokens}`` →
``{tokens, count, max_model_len}`` (a prompt array gives a list per prompt and a count per prompt),
``{model, tokens}`` → ``{text}`` (a list of lists gives a text per list). No engine call."""

from __future__ import annotations

from typing import Any

import orjson

from inference import errors
from inference.pipeline.prompt import tokenize
from inference.routing.workers import WorkerHandle
from inference.served.base import LocalAnswer, ServedSurface, engine_target

__all__ = ["ServedTokenize", "ServedDetokenize"]


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(item) is int and item >= 0 for item in value)


class ServedTokenize(ServedSurface):
    async def open(self, worker: WorkerHandle) -> LocalAnswer:
        body = self.request.body
        prompt = body.get("prompt")
        special = body.get("add_special_tokens", True)
        if not isinstance(special, bool):
            raise errors.invalid_request("add_special_tokens must be a boolean", "add_special_tokens")
        if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and prompt and all(isinstance(item, str) for item in prompt)
        ):
            raise errors.invalid_request("prompt must be a string or a non-empty array of strings", "prompt")
        target = engine_target(self.request.dp, worker, self.request.model)
        if isinstance(prompt, str):
            tokens: Any = list(await tokenize(target.tokenizer, prompt, add_special_tokens=special))
            count: Any = len(tokens)
        else:
            tokens = [list(await tokenize(target.tokenizer, item, add_special_tokens=special)) for item in prompt]
            count = [len(item) for item in tokens]
        answer = {"tokens": tokens, "count": count, "max_model_len": target.spec.context_length}
        return LocalAnswer(orjson.dumps(answer))


class ServedDetokenize(ServedSurface):
    async def open(self, worker: WorkerHandle) -> LocalAnswer:
        body = self.request.body
        tokens = body.get("tokens")
        skip = body.get("skip_special_tokens", True)
        if not isinstance(skip, bool):
            raise errors.invalid_request("skip_special_tokens must be a boolean", "skip_special_tokens")
        nested = isinstance(tokens, list) and bool(tokens) and all(isinstance(item, list) for item in tokens)
        if not (_ids(tokens) or (nested and all(_ids(item) for item in tokens))):  # type: ignore[union-attr]
            raise errors.invalid_request("tokens must be an array of token IDs or of arrays of token IDs", "tokens")
        target = engine_target(self.request.dp, worker, self.request.model)
        vocab = target.tokenizer.vocab_size
        lists: list[list[int]] = tokens if nested else [tokens]  # type: ignore[assignment,list-item]
        if any(token >= vocab for item in lists for token in item):
            raise errors.invalid_request(f"token IDs must be below the vocabulary size {vocab}", "tokens")
        texts = [target.tokenizer.decode(item, skip_special_tokens=skip) for item in lists]
        return LocalAnswer(orjson.dumps({"text": texts if nested else texts[0]}))

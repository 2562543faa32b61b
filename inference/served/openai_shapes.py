"""The OpenAI wire shapes the chat and text completion surfaces share: usage and logprobs."""

from __future__ import annotations

from typing import Any, Sequence

from inference.pipeline.events import Usage
from inference.pipeline.tokenizers import ModelTokenizer
from inference.upstreams.engine import TokenLogprobs

__all__ = ["usage_json", "chat_logprobs", "completion_logprobs"]


def usage_json(usage: Usage) -> dict[str, Any]:
    """``usage`` (spec 1): prompt counted once, cached tokens, reasoning tokens when non-zero, the
    speculative counters only when the engine reported proposed draft tokens."""
    found: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    details: dict[str, int] = {}
    if usage.reasoning_tokens:
        details["reasoning_tokens"] = usage.reasoning_tokens
    if usage.draft_tokens:  # speculative decoding, only when the engine reported proposed drafts
        details["accepted_prediction_tokens"] = usage.accepted_tokens
        details["rejected_prediction_tokens"] = usage.draft_tokens - usage.accepted_tokens
    if details:
        found["completion_tokens_details"] = details
    return found


def _entry(tokenizer: ModelTokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokenizer: ModelTokenizer, logprobs: Sequence[TokenLogprobs]) -> dict[str, Any]:
    """Chat's ``logprobs``: ``{content: [{token, logprob, bytes, top_logprobs: [...]}], refusal: null}``
    (the OpenAI description requires both keys)."""
    return {
        "content": [
            {
                **_entry(tokenizer, item.token_id, item.logprob),
                "top_logprobs": [_entry(tokenizer, token_id, logprob) for token_id, logprob in item.top],
            }
            for item in logprobs
        ],
        "refusal": None,
    }


def completion_logprobs(
    tokenizer: ModelTokenizer, logprobs: Sequence[TokenLogprobs], text_offset: int = 0
) -> dict[str, Any]:
    """Completions' ``logprobs``: tokens, token_logprobs, top_logprobs (token → logprob per
    position) and text_offset."""
    tokens: list[str] = []
    offsets: list[int] = []
    offset = text_offset
    for item in logprobs:
        text = tokenizer.token_text(item.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [item.logprob for item in logprobs],
        "top_logprobs": [
            {tokenizer.token_text(token_id): logprob for token_id, logprob in item.top} for item in logprobs
        ],
        "text_offset": offsets,
    }

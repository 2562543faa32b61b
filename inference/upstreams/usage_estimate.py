"""What a relayed stream used when its worker never said (docs/DECISIONS.md D80): the client left
before the end, the worker broke off, or the upstream reports no usage at all. Workers report a
stream's usage in its last event, so such a stream would otherwise be charged nothing for work the
worker did. Computed only then (on the request's close), from what the request already holds: nothing
is counted per chunk beyond the SSE data events the response writer counts anyway.

- **Completion tokens**: one per data event the client received, less the events a stream opens
  with before its first token. OpenAI-compatible engines send one event per decode step (vLLM and
  SGLang emit a chunk per generated token, after a first chunk that carries only the role), so a cut
  stream's events are its tokens; several tokens per event (speculative decoding, a detokenizer
  holding back part of a character, providers that batch text) make it an underestimate. A stream
  that ended in full without a usage (a provider not asked for one) also sent its closing events:
  on chat and completions the finish chunk and ``[DONE]``, not counted. Counts the stream did report (Anthropic's message_start, vLLM's continuous usage, SGLang's meta_info) are a
  floor: the higher of the two is taken.
- **Prompt tokens**: the reported count when the stream gave one, else the request's text (as
  cache-aware routing reads it: messages, prompt, input, instructions) at four characters a token,
  the common rule of thumb for English text. The gateway has no tokenizer for relayed workers, and
  loading one to charge a cancelled request would cost more than the request.
"""

from __future__ import annotations

import orjson

from inference.accounting import EstimatedUsage, TokenUsage
from inference.routing.request_text import request_text

__all__ = ["CHARS_PER_TOKEN", "CLOSING_EVENTS", "OPENING_EVENTS", "prompt_estimate", "stream_estimate"]

CHARS_PER_TOKEN = 4

OPENING_EVENTS = {
    "/v1/chat/completions": 1,  # the chunk with the role and empty content
    "/v1/messages": 3,  # message_start, content_block_start, ping
    "/v1/responses": 4,  # response.created, .in_progress, .output_item.added, .content_part.added
    "/v1/interactions": 1,  # interaction.start
}
"""The data events a stream sends on each route before its first token (none on the others:
completions and /generate start with a token)."""

CLOSING_EVENTS = {"/v1/chat/completions": 2, "/v1/completions": 2}
"""The data events a whole stream sends after its last token where its usage may be missing: the
finish chunk (an empty delta, as OpenAI sends it) and ``[DONE]``. The other routes' streams always
close with their usage (message_delta, response.completed, interaction.complete)."""


def prompt_estimate(body: bytes) -> int:
    """The request's prompt at :data:`CHARS_PER_TOKEN` characters a token (0 for a body that is not JSON)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 0
    return -(-len(request_text(parsed)) // CHARS_PER_TOKEN)


def stream_estimate(
    path: str, body: bytes, events: int, reported: TokenUsage | None, ended: bool = False
) -> EstimatedUsage:
    """The usage of a stream on ``path`` whose request was ``body``, after ``events`` data events went to
    the client, with what the stream itself ``reported`` so far (None: nothing); ``ended``: the stream
    ended in full (its closing events are not tokens)."""
    overhead = OPENING_EVENTS.get(path, 0) + (CLOSING_EVENTS.get(path, 0) if ended else 0)
    completion = max(events - overhead, 0)
    if reported is None:
        return EstimatedUsage(prompt_estimate(body), completion)
    prompt = reported.prompt or prompt_estimate(body)
    return EstimatedUsage(prompt, max(reported.completion, completion), reported.cached, reported.reasoning)

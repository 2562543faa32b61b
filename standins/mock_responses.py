"""Request parsing and payload builders of the mock worker (:mod:`standins.mock_worker`).

Pure functions, no I/O; what can be precomputed is cached, so the mock stays cheap in benchmarks.

The mock's tokenizer: one token per whitespace-separated word, whose id is a stable hash of the word
(``crc32 % 100_000 + 1_000``). Generated text is ``tok0 tok1 ... tokN-1``, one token per word.
Detokenizing maps ids back through the words the mock has seen (generated words always resolve);
an unknown id reads ``<id>``.
"""

from __future__ import annotations

import array
import base64
import hashlib
import math
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

__all__ = [
    "message_object",
    "message_stream",
    "messages_input_tokens",
    "response_object",
    "response_stream",
    "responses_input_tokens",
    "CLASS_LABELS",
    "DONE",
    "Controls",
    "MockError",
    "budget",
    "chat_completion",
    "chat_prompt_tokens",
    "chat_stream",
    "classify_payload",
    "completion_stream",
    "completion_text",
    "count_tokens",
    "detokenize",
    "detokenize_payload",
    "embedding_vector",
    "embeddings_payload",
    "encode_base64",
    "error_body",
    "generate_result",
    "generate_stream",
    "int_field",
    "parse_controls",
    "prompt_list",
    "rerank_payload",
    "text_completion",
    "tokenize",
    "tokenize_payload",
]

DONE = b"data: [DONE]\n\n"
CLASS_LABELS: tuple[str, str] = ("negative", "positive")
_MAX_DIMENSIONS = 8192
_VOCAB_LIMIT = 200_000
_vocab: dict[int, str] = {}
_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "method_not_allowed",
    408: "timeout_error",
    409: "conflict_error",
    413: "payload_too_large",
    422: "unprocessable_entity",
    429: "rate_limit_error",
}

Prompt = str | list[int]


class MockError(Exception):
    """Raised while handling a request; answered as an OpenAI-style error JSON."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}``, the numeric status as code (like vLLM)."""
    error_type = _TYPE_BY_STATUS.get(status) or ("server_error" if status >= 500 else "error")
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": status}})


# --- request parsing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Controls:
    """The effective per-request ``mock`` controls."""

    tokens: int
    delay_s: float
    fail_after: int | None = None
    status: int | None = None


def int_field(value: Any, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise MockError(400, f"{name} must be an integer between {low} and {high}", name)
    return value


def parse_controls(body: dict[str, Any], default: Controls) -> Controls:
    mock = body.get("mock")
    if mock is None:
        return default
    if not isinstance(mock, dict):
        raise MockError(400, "mock must be an object", "mock")
    tokens = default.tokens
    if mock.get("tokens") is not None:
        tokens = int_field(mock["tokens"], "mock.tokens", 0, 1 << 20)
    delay_s = default.delay_s
    if mock.get("delay_ms") is not None:
        delay = mock["delay_ms"]
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            raise MockError(400, "mock.delay_ms must be a number >= 0", "mock.delay_ms")
        delay_s = delay / 1000
    fail_after = mock.get("fail_after")
    if fail_after is not None:
        fail_after = int_field(fail_after, "mock.fail_after", 0, 1 << 20)
    status = mock.get("status")
    if status is not None:
        status = int_field(status, "mock.status", 100, 599)
    return Controls(tokens, delay_s, fail_after, status if status and status >= 400 else None)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def prompt_list(value: Any, name: str) -> list[Prompt]:
    """A prompt/input: a string, a list of token ids, or a non-empty list of either."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if _is_ids(value):
            return [value]
        if all(isinstance(v, str) or _is_ids(v) for v in value):
            return list(value)
    raise MockError(400, f"{name} must be a string, a list of strings or token ids", name)


def count_tokens(prompt: Prompt) -> int:
    return len(prompt.split()) if isinstance(prompt, str) else len(prompt)


def chat_prompt_tokens(messages: Sequence[Any]) -> int:
    """Words of every text content (a string, or the ``text`` parts of a content list)."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"].split())
    return total


def budget(max_model_len: int, tokens: int, cap: Any, cap_name: str, prompt_tokens: int) -> tuple[int, str]:
    """(completion tokens, finish_reason) under the max-tokens cap and the context window, vLLM-style."""
    if cap is not None:
        cap = int_field(cap, cap_name, 0, 1 << 30)
    room = max_model_len - prompt_tokens
    if room <= 0 or (cap is not None and cap > room):
        raise MockError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + (cap or 0)} tokens ({prompt_tokens} in the messages, {cap or 0} in the "
            "completion).",
        )
    limit = room if cap is None else cap
    return (limit, "length") if tokens >= limit else (tokens, "stop")


# --- tokenizer and generated text ---------------------------------------------------------------


def _word_id(word: str) -> int:
    token_id = zlib.crc32(word.encode()) % 100_000 + 1_000
    if len(_vocab) < _VOCAB_LIMIT:
        _vocab.setdefault(token_id, word)
    return token_id


def tokenize(text: str) -> list[int]:
    return [_word_id(word) for word in text.split()]


def detokenize(ids: Sequence[int]) -> str:
    return " ".join(_vocab.get(token_id) or f"<{token_id}>" for token_id in ids)


@lru_cache(maxsize=256)
def _words(count: int) -> tuple[str, ...]:
    words = tuple(f"tok{i}" for i in range(count))
    for word in words[:4096]:
        _word_id(word)
    return words


@lru_cache(maxsize=256)
def completion_text(count: int) -> str:
    """``tok0 tok1 ...`` with ``count`` words."""
    return " ".join(_words(count))


@lru_cache(maxsize=64)
def _pieces(count: int) -> tuple[bytes, ...]:
    """JSON-encoded stream deltas whose concatenation is ``completion_text(count)``."""
    return tuple(orjson.dumps(word if i == 0 else " " + word) for i, word in enumerate(_words(count)))


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chunk_prefix(rid: str, obj: str, created: int, model: str) -> bytes:
    return b'data: {"id":%b,"object":"%b","created":%d,"model":%b,"choices":[{"index":' % (
        orjson.dumps(rid),
        obj.encode(),
        created,
        orjson.dumps(model),
    )


def _stream_tail(
    prefix: bytes, indexes: list[bytes], finish_part: bytes, usage_chunk: dict[str, Any] | None
) -> bytes:
    tail = [prefix + idx + finish_part for idx in indexes]
    if usage_chunk is not None:
        tail.append(b"data: " + orjson.dumps(usage_chunk) + b"\n\n")
    tail.append(DONE)
    return b"".join(tail)


# --- chat and text completions ------------------------------------------------------------------


def chat_completion(
    rid: str, created: int, model: str, n: int, tokens: int, finish: str, prompt_tokens: int
) -> dict[str, Any]:
    message = {"role": "assistant", "content": completion_text(tokens)}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "message": message, "logprobs": None, "finish_reason": finish} for i in range(n)
        ],
        "usage": _usage(prompt_tokens, tokens * n),
    }


def chat_stream(
    rid: str,
    created: int,
    model: str,
    n: int,
    tokens: int,
    finish: str,
    prompt_tokens: int,
    include_usage: bool,
) -> tuple[list[bytes], bytes]:
    """(one SSE block per generated token, covering all ``n`` choices; the closing bytes)."""
    obj = "chat.completion.chunk"
    prefix = _chunk_prefix(rid, obj, created, model)
    indexes = [b"%d" % i for i in range(n)]
    first, rest = b',"delta":{"role":"assistant","content":', b',"delta":{"content":'
    end = b'},"logprobs":null,"finish_reason":null}]}\n\n'
    steps = [
        b"".join(prefix + idx + (rest if j else first) + piece + end for idx in indexes)
        for j, piece in enumerate(_pieces(tokens) or (b'""',))
    ]
    usage = None
    if include_usage:
        usage = {"id": rid, "object": obj, "created": created, "model": model, "choices": []}
        usage["usage"] = _usage(prompt_tokens, tokens * n)
    finish_part = b',"delta":{},"logprobs":null,"finish_reason":"%b"}]}\n\n' % finish.encode()
    return steps, _stream_tail(prefix, indexes, finish_part, usage)


def text_completion(
    rid: str, created: int, model: str, choices: int, tokens: int, finish: str, prompt_tokens: int
) -> dict[str, Any]:
    text = completion_text(tokens)
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish} for i in range(choices)
        ],
        "usage": _usage(prompt_tokens, tokens * choices),
    }


def completion_stream(
    rid: str,
    created: int,
    model: str,
    choices: int,
    tokens: int,
    finish: str,
    prompt_tokens: int,
    include_usage: bool,
) -> tuple[list[bytes], bytes]:
    """Like OpenAI, intermediate chunks carry ``finish_reason: null``."""
    obj = "text_completion"
    prefix = _chunk_prefix(rid, obj, created, model)
    indexes = [b"%d" % i for i in range(choices)]
    end = b',"logprobs":null,"finish_reason":null}]}\n\n'
    steps = [
        b"".join(prefix + idx + b',"text":' + piece + end for idx in indexes) for piece in _pieces(tokens)
    ]
    usage = None
    if include_usage:
        usage = {"id": rid, "object": obj, "created": created, "model": model, "choices": []}
        usage["usage"] = _usage(prompt_tokens, tokens * choices)
    finish_part = b',"text":"","logprobs":null,"finish_reason":"%b"}]}\n\n' % finish.encode()
    return steps, _stream_tail(prefix, indexes, finish_part, usage)


# --- the Responses API (an HTTP worker answering /v1/responses itself) ---------------------------


def responses_input_tokens(value: Any) -> int:
    """Prompt tokens of a Responses ``input`` (a string or items whose text parts are counted)."""
    if isinstance(value, str):
        return count_tokens(value)
    if not isinstance(value, list) or not value:
        raise MockError(400, "input must be a string or a non-empty list of items", "input")
    texts: list[str] = []
    for item in value:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return count_tokens(" ".join(texts))


def response_object(
    rid: str, created: int, model: str, tokens: int, finish: str, prompt_tokens: int, status: str = "completed"
) -> dict[str, Any]:
    """A Responses API response object with one assistant message of ``tokens`` words."""
    done = status != "in_progress"
    if done and finish == "length":
        status = "incomplete"
    message = {
        "id": "msg_" + rid.removeprefix("resp_"), "type": "message", "role": "assistant",
        "status": "completed" if finish == "stop" else "incomplete",
        "content": [{"type": "output_text", "text": completion_text(tokens), "annotations": []}],
    }  # fmt: skip
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
        "output": [message] if done else [], "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if done and finish == "length" else None,
        "instructions": None, "metadata": {}, "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0,
        "tool_choice": "auto", "tools": [],
        "usage": {
            "input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + tokens,
        } if done else None,
    }  # fmt: skip


def _event(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps({"type": kind, "sequence_number": sequence, **fields}))


def response_stream(
    rid: str, created: int, model: str, tokens: int, finish: str, prompt_tokens: int
) -> tuple[list[bytes], bytes]:
    """The Responses events of :func:`response_object`: created and in_progress, the message's item
    and part opened, one output_text delta per token, then everything closed and the terminal event
    (no [DONE]). (one SSE block per token with the opening ones in the first; the closing bytes)."""
    whole = response_object(rid, created, model, tokens, finish, prompt_tokens)
    opening = response_object(rid, created, model, tokens, finish, prompt_tokens, status="in_progress")
    message = whole["output"][0]
    item_id = message["id"]
    started = {**message, "status": "in_progress", "content": []}
    empty = {"type": "output_text", "text": "", "annotations": []}
    head = [
        _event("response.created", 0, {"response": opening}),
        _event("response.in_progress", 1, {"response": opening}),
        _event("response.output_item.added", 2, {"output_index": 0, "item": started}),
        _event("response.content_part.added", 3, {"item_id": item_id, "output_index": 0, "content_index": 0, "part": empty}),
    ]  # fmt: skip
    words = _words(tokens)
    steps = [
        _event("response.output_text.delta", 4 + i, {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                     "delta": word if i == 0 else " " + word, "logprobs": []})
        for i, word in enumerate(words)
    ]  # fmt: skip
    steps = [b"".join(head) + steps[0], *steps[1:]] if steps else [b"".join(head)]
    sequence = 4 + len(words)
    text = completion_text(tokens)
    part = message["content"][0]
    terminal = "response.completed" if finish == "stop" else "response.incomplete"
    tail = [
        _event("response.output_text.done", sequence, {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                      "text": text, "logprobs": []}),
        _event("response.content_part.done", sequence + 1, {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                           "part": part}),
        _event("response.output_item.done", sequence + 2, {"output_index": 0, "item": message}),
        _event(terminal, sequence + 3, {"response": whole}),
    ]  # fmt: skip
    return steps, b"".join(tail)


# --- the Messages API (an HTTP worker answering /v1/messages itself) ------------------------------


def messages_input_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens of a Messages request: the words of ``system`` and of every message's text
    (a string, or its text blocks)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MockError(400, "messages must be a non-empty list", "messages")
    system = body.get("system")
    blocks = [{"content": system}] if isinstance(system, (str, list)) else []
    return chat_prompt_tokens([*blocks, *messages])


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def message_object(rid: str, model: str, tokens: int, finish: str, prompt_tokens: int) -> dict[str, Any]:
    """A Messages answer with one text block of ``tokens`` words."""
    return {
        "id": rid, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": completion_text(tokens)}],
        "stop_reason": _STOP_REASONS[finish], "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": tokens,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }  # fmt: skip


def _message_event(kind: str, fields: dict[str, Any]) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))


def message_stream(rid: str, model: str, tokens: int, finish: str, prompt_tokens: int) -> tuple[list[bytes], bytes]:
    """The Messages events of :func:`message_object`, as Anthropic sends them: message_start (empty
    content, the input counters), content_block_start, a ping, one text_delta per token,
    content_block_stop, message_delta (stop_reason and the final usage), message_stop; no [DONE].
    (one SSE block per token with the opening ones in the first; the closing bytes)."""
    whole = message_object(rid, model, tokens, finish, prompt_tokens)
    opening = {**whole, "content": [], "stop_reason": None, "usage": {**whole["usage"], "output_tokens": 0}}
    head = b"".join((
        _message_event("message_start", {"message": opening}),
        _message_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _message_event("ping", {}),
    ))  # fmt: skip
    steps = [
        _message_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": word if i == 0 else " " + word}})
        for i, word in enumerate(_words(tokens))
    ]  # fmt: skip
    steps = [head + steps[0], *steps[1:]] if steps else [head]
    delta = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    tail = b"".join((
        _message_event("content_block_stop", {"index": 0}),
        _message_event("message_delta", {"delta": delta, "usage": {"output_tokens": tokens}}),
        _message_event("message_stop", {}),
    ))  # fmt: skip
    return steps, tail


# --- embeddings, rerank, classify, tokenize -----------------------------------------------------


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@lru_cache(maxsize=4096)
def embedding_vector(text: str, dimensions: int = 8) -> tuple[float, ...]:
    """A deterministic unit vector derived from ``text`` (xorshift64 seeded by blake2b)."""
    state = _seed(text) or 1
    values: list[float] = []
    for _ in range(dimensions):
        state ^= (state << 13) & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 7
        state ^= (state << 17) & 0xFFFFFFFFFFFFFFFF
        values.append((state % 2_000_001) / 1_000_000 - 1.0)
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return tuple(round(v / norm, 6) for v in values)


def encode_base64(vector: Sequence[float]) -> str:
    """Little-endian float32, base64: what OpenAI returns for ``encoding_format: base64``."""
    return base64.b64encode(array.array("f", vector).tobytes()).decode()


def _key(prompt: Prompt) -> str:
    return prompt if isinstance(prompt, str) else repr(prompt)


def embeddings_payload(body: dict[str, Any], model: str) -> dict[str, Any]:
    """8 floats per input by default (``dimensions`` overrides); honours ``encoding_format``."""
    inputs = prompt_list(body.get("input"), "input")
    dims = body.get("dimensions")
    dims = 8 if dims is None else int_field(dims, "dimensions", 1, _MAX_DIMENSIONS)
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for index, item in enumerate(inputs):
        vector = embedding_vector(_key(item), dims)
        embedding = encode_base64(vector) if as_base64 else vector
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    prompt_tokens = sum(map(count_tokens, inputs))
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _rerank_score(query: str, document: str) -> float:
    """Share of the query's words found in the document, plus a small deterministic tie-break."""
    query_words = set(query.lower().split())
    overlap = len(query_words & set(document.lower().split())) / len(query_words) if query_words else 0.0
    return round(0.9 * overlap + 0.1 * (_seed(query + "\x00" + document) % 10_000) / 10_000, 6)


def rerank_payload(body: dict[str, Any], model: str) -> dict[str, Any]:
    query, documents = body.get("query"), body.get("documents")
    if not isinstance(query, str) or not isinstance(documents, list):
        raise MockError(400, "query must be a string and documents a list")
    texts = [str(d.get("text", "")) if isinstance(d, dict) else str(d) for d in documents]
    results: list[dict[str, Any]] = [
        {"index": i, "relevance_score": _rerank_score(query, text)} for i, text in enumerate(texts)
    ]
    results.sort(key=lambda r: (-r["relevance_score"], r["index"]))
    if body.get("top_n") is not None:
        results = results[: int_field(body["top_n"], "top_n", 0, 1 << 20)]
    if body.get("return_documents", True):
        for result in results:
            result["document"] = {"text": texts[result["index"]]}
    tokens = len(query.split()) + sum(len(t.split()) for t in texts)
    usage = {"total_tokens": tokens}
    return {"id": "rerank-" + os.urandom(12).hex(), "model": model, "results": results, "usage": usage}


def classify_payload(body: dict[str, Any], model: str) -> dict[str, Any]:
    """Two classes (``negative``, ``positive``) with probabilities derived from the input."""
    inputs = prompt_list(body.get("input"), "input")
    data = []
    for index, item in enumerate(inputs):
        positive = round((_seed(_key(item)) % 10_000) / 10_000, 4)
        probs = [round(1.0 - positive, 4), positive]
        label = CLASS_LABELS[probs[1] > probs[0]]
        data.append({"index": index, "label": label, "probs": probs, "num_classes": len(probs)})
    prompt_tokens = sum(map(count_tokens, inputs))
    return {
        "id": "classify-" + os.urandom(12).hex(),
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
    }


def tokenize_payload(body: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """``{model, prompt}`` (or chat ``messages``) -> ``{tokens, count, max_model_len}``."""
    if isinstance(body.get("prompt"), str):
        text = body["prompt"]
    elif isinstance(body.get("messages"), list):
        contents = (m.get("content") if isinstance(m, dict) else None for m in body["messages"])
        text = " ".join(c for c in contents if isinstance(c, str))
    else:
        raise MockError(400, "prompt must be a string (or messages a list)", "prompt")
    ids = tokenize(text)
    return {"tokens": ids, "count": len(ids), "max_model_len": max_model_len}


def detokenize_payload(body: dict[str, Any]) -> dict[str, Any]:
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise MockError(400, "tokens must be a list of integers", "tokens")
    return {"prompt": detokenize(ids)}


# --- SGLang native /generate --------------------------------------------------------------------


def _meta(rid: str, prompt_tokens: int, completion_tokens: int, finished: bool) -> dict[str, Any]:
    return {
        "id": rid,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
        "finish_reason": {"type": "length", "length": completion_tokens} if finished else None,
    }


def generate_result(rid: str, prompt_tokens: int, tokens: int) -> dict[str, Any]:
    """The mock always reports ``{"type": "length"}``, as SGLang does when max_new_tokens is hit."""
    return {"text": completion_text(tokens), "meta_info": _meta(rid, prompt_tokens, tokens, True)}


def generate_stream(rid: str, prompt_tokens: int, tokens: int) -> tuple[list[bytes], bytes]:
    """Like SGLang, every chunk carries the cumulative text so far."""
    words = _words(tokens)
    steps = [
        b"data: "
        + orjson.dumps(
            {"text": " ".join(words[: j + 1]), "meta_info": _meta(rid, prompt_tokens, j + 1, j + 1 == tokens)}
        )
        + b"\n\n"
        for j in range(tokens)
    ]
    if tokens:
        return steps, DONE
    return steps, b"data: " + orjson.dumps(generate_result(rid, prompt_tokens, 0)) + b"\n\n" + DONE

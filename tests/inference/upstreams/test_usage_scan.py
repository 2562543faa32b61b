"""Reading a relayed answer's usage from its bytes (inference.upstreams.usage_scan, D66): whole
answers of every API shape, and streams cut anywhere, with the usage-only event the gateway asked for
taken out of what the client receives and nothing else changed."""

from __future__ import annotations

import pytest

from inference.accounting import TokenUsage
from inference.upstreams.usage_scan import StreamUsage, usage_in_body, usage_key

OPENAI = (
    b'{"id":"c","choices":[{"message":{"content":"say \\"usage\\": {\\"prompt_tokens\\": 99}"}}],'
    b'"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,'
    b'"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":2}}}'
)


def test_whole_answers_of_each_shape() -> None:
    assert usage_in_body(OPENAI) == TokenUsage(12, 5, 3, 2)  # the content's quoted text is not the usage
    responses = b'{"usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":1},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0}},"user":null}'
    assert usage_in_body(responses) == TokenUsage(7, 4, 1, 0)
    anthropic = b'{"content":[],"usage":{"input_tokens":5,"cache_creation_input_tokens":2,"cache_read_input_tokens":10,"output_tokens":8}}'
    assert usage_in_body(anthropic) == TokenUsage(17, 8, 10, 0)  # every input token is a prompt token
    native = b'{"text":"a b","meta_info":{"id":"r","prompt_tokens":3,"completion_tokens":2,"cached_tokens":0}}'
    assert usage_in_body(native, usage_key("/generate")) == TokenUsage(3, 2, 0, 0)
    assert usage_in_body(b'{"choices":[],"usage": null}') is None
    assert usage_in_body(b'{"data":[]}') is None


STREAM = (
    b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
    b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)
WITHOUT = STREAM.replace(b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n', b"")


def _through(scan: StreamUsage, stream: bytes, step: int) -> bytes:
    out = b"".join(scan.feed(stream[i : i + step]) for i in range(0, len(stream), step))
    return out + scan.end()


@pytest.mark.parametrize("step", range(1, len(STREAM) + 1, 3))
def test_a_stream_cut_anywhere(step: int) -> None:
    kept = StreamUsage()
    assert _through(kept, STREAM, step) == STREAM and kept.usage() == TokenUsage(7, 2)
    stripped = StreamUsage(strip=True)
    assert _through(stripped, STREAM, step) == WITHOUT and stripped.usage() == TokenUsage(7, 2)
    crlf = StreamUsage(strip=True)
    assert _through(crlf, STREAM.replace(b"\n", b"\r\n"), step) == WITHOUT.replace(b"\n", b"\r\n")


def test_running_totals_keep_the_highest() -> None:
    anthropic = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":14}}\n\n'
    )
    scan = StreamUsage()
    assert _through(scan, anthropic, 7) == anthropic and scan.usage() == TokenUsage(9, 14)
    assert StreamUsage().usage() is None  # a stream that reported nothing

"""Reading a relayed answer's usage from its bytes (inference.upstreams.usage_scan, D66): whole
answers of every API shape, and streams cut anywhere, with the usage-only event the gateway asked for
taken out of what the client receives and nothing else changed; and the estimate of a stream that
ended without its usage (inference.upstreams.usage_estimate, D80)."""

from __future__ import annotations

import pytest

from inference.accounting import EstimatedUsage, TokenUsage
from inference.upstreams.usage_estimate import prompt_estimate, stream_estimate
from inference.upstreams.usage_scan import (
    _NAME_END, _SLOT, NullUsageStream, StreamUsage, _counts, usage_in_body, usage_key,
)

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


def test_the_usual_answers_read_as_every_answer_is() -> None:
    """The prompt and completion pair alone (vLLM's answer, OpenAI's without details) is read without
    the general fold (D85): the same usage as the fold gives, for it and for its near shapes."""
    from inference.upstreams.usage_scan import _counts

    bodies = [
        b'{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":16,"total_tokens":56}}',
        b'{"usage": {"prompt_tokens":3,"total_tokens":3,"completion_tokens":0,"prompt_tokens_details":null},"x":null}',
        b'{"usage":{"completion_tokens":16,"prompt_tokens":40}}',  # the other order: the fold
        b'{"usage":{"prompt_tokens":4,"prompt_tokens":9}}',
        b'{"usage":{"input_tokens":4,"output_tokens":2}}',
        b'{"usage":{"prompt_tokens":4}}',
        b'{"usage":{"total_input_tokens":4,"total_output_tokens":2,"total_thought_tokens":1}}',
    ]
    for body in bodies:
        counts = [0, 0, 0, 0]
        at = body.rfind(b'"usage"')
        assert usage_in_body(body) == (TokenUsage(*counts) if _counts(body, at, len(body), counts) else None), body


def test_the_usual_usage_cut_at_its_keys_reads_as_every_answer_is() -> None:
    """The usual usage near the answer's end is read by cutting its bytes at the fixed keys (D101):
    the same usage as the general reading gives, for it and for every shape near it (another count
    or usage key after it, spaces, signs, a usage out of the window, a count's name in a string)."""
    assert all(name.endswith(_NAME_END[:-1]) for name in _SLOT)  # what the cut looks for after the total
    usual = b'"usage":{"prompt_tokens":40,"completion_tokens":16,"total_tokens":56}'
    bodies = [
        b'{"choices":[]},' + usual + b"}",
        b'{"choices":[],' + usual + b',"prompt_logprobs":null,"kv_transfer_params":null}',
        b'{"choices":[],' + usual + b',"x":{"cached_tokens":3}}',
        b'{"choices":[],' + usual + b',"x":"say \\"cached_tokens\\": 3"}',
        b'{"choices":[],' + usual + b',"usage":null}',
        b'{"choices":[],' + usual + b',"y":{"usage":{"prompt_tokens":1}}}',
        b'{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":16,"total_tokens":56,'
        b'"prompt_tokens_details":{"cached_tokens":8}}}',
        b'{"usage":{"prompt_tokens":-4,"completion_tokens":16,"total_tokens":12}}',
        b'{"usage":{"prompt_tokens":4,"completion_tokens":+16,"total_tokens":20}}',
        b'{"usage":{"prompt_tokens":4 ,"completion_tokens":16,"total_tokens":20}}',
        b'{"usage":{"prompt_tokens":4,"completion_tokens":1_6,"total_tokens":20}}',
        b'{"usage":{"prompt_tokens":,"completion_tokens":16,"total_tokens":20}}',
        b'{"usage":{"prompt_tokens":4,"completion_tokens":16},"total_tokens":20}',
        b'{"usage":{"prompt_tokens":4,"completion_tokens":16}}',
        b'{"usage": {"prompt_tokens":4,"completion_tokens":16,"total_tokens":20}}',
        b'{"choices":[],' + usual + b',"pad":"' + b"x" * 300 + b'"}',
        b'{"choices":[],"usage":{"prompt_tokens":' + b"9" * 300 + b',"completion_tokens":16,"total_tokens":1}}',
        b'{"choices":[{"text":"' + usual.replace(b'"', b'\\"') + b'"}],' + usual + b"}",
        usual[8:],
    ]
    general_key = bytes(bytearray(b'"usage"'))  # equal to the usual key but not it: the general reading
    for body in bodies:
        counts = [0, 0, 0, 0]
        at = body.rfind(b'"usage"')
        assert usage_in_body(body) == usage_in_body(body, general_key), body
        if at >= 0 and body.startswith(b":{", at + 7):
            assert usage_in_body(body) == (TokenUsage(*counts) if _counts(body, at, len(body), counts) else None)
    assert usage_in_body(bodies[0]) == TokenUsage(40, 16) and usage_in_body(bodies[2]) == TokenUsage(40, 16, 3)


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


def test_gemini_interactions_usage() -> None:
    interaction = b'{"object":"interaction","usage":{"total_input_tokens":11,"total_cached_tokens":4,"total_output_tokens":6,"total_thought_tokens":3,"total_tokens":20}}'
    assert usage_in_body(interaction) == TokenUsage(11, 9, 4, 3)  # thoughts are output, outside total_output_tokens


@pytest.mark.parametrize("step", range(1, len(STREAM) + 1, 3))
def test_an_asked_openai_stream_loses_its_null_usage_fields_too(step: int) -> None:
    unasked = WITHOUT.replace(b',"usage":null', b"")  # what OpenAI sends a client that did not ask
    stripped = NullUsageStream(strip=True)
    assert _through(stripped, STREAM, step) == unasked and stripped.usage() == TokenUsage(7, 2)
    kept = NullUsageStream()  # the client asked: its null fields are its own
    assert _through(kept, STREAM, step) == STREAM


# --- a stream that ended without its usage (usage_estimate, D80) ------------------------------------------

CHAT_BODY = b'{"model":"m","messages":[{"role":"user","content":"hello there friend"}],"stream":true}'


def test_the_prompt_is_estimated_at_four_characters_a_token() -> None:
    assert prompt_estimate(CHAT_BODY) == 6  # "user:\nhello there friend": 24 characters
    assert prompt_estimate(b'{"prompt":"abcde"}') == 2  # rounded up
    assert prompt_estimate(b"not json") == 0


def test_a_stream_estimate_leaves_out_the_events_that_carry_no_token() -> None:
    cut = stream_estimate("/v1/chat/completions", CHAT_BODY, 5, None)
    assert type(cut) is EstimatedUsage and (cut.prompt, cut.completion) == (6, 4)  # the role chunk left out
    assert stream_estimate("/v1/chat/completions", CHAT_BODY, 7, None, ended=True).completion == 4  # finish, [DONE]
    assert stream_estimate("/v1/completions", CHAT_BODY, 5, None).completion == 5
    assert stream_estimate("/v1/responses", CHAT_BODY, 9, None).completion == 5  # created .. content_part.added
    assert stream_estimate("/v1/chat/completions", CHAT_BODY, 0, None).completion == 0
    # What the stream reported is a floor, and its prompt is taken over the estimate.
    reported = stream_estimate("/v1/messages", CHAT_BODY, 13, TokenUsage(40, 1, 8, 0))
    assert (reported.prompt, reported.completion, reported.cached) == (40, 10, 8)
    assert stream_estimate("/generate", CHAT_BODY, 3, TokenUsage(5, 7)).completion == 7

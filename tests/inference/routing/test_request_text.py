"""request_text: the text cache-aware routing matches on, from any request shape."""

from __future__ import annotations

import pytest

from inference.routing.request_text import request_text


def test_chat_messages_in_order_with_roles() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "what is it?"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": "42"},
        ]
    }
    assert request_text(body) == "system:\nBe brief.\nuser:\nLook:\nwhat is it?\nassistant:\ntool:\n42"


def test_shared_prefix_gives_shared_text_prefix() -> None:
    first = request_text({"messages": [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "a"}]})
    second = request_text({"messages": [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "b"}]})
    assert first[:-1] == second[:-1] and first != second


def test_anthropic_system_comes_first() -> None:
    body = {"system": [{"type": "text", "text": "You are Claude."}], "messages": [{"role": "user", "content": "hi"}]}
    assert request_text(body) == "You are Claude.\nuser:\nhi"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": "Once upon"}, "Once upon"),
        ({"prompt": ["a", "b"]}, "a\nb"),
        ({"prompt": [1, 2, 30]}, "1 2 30"),
        ({"prompt": [[1, 2], [3]]}, "1 2\n3"),
        ({"input": "embed me"}, "embed me"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}, "user:\nhi"),
        ({"instructions": "Be nice.", "input": "hi"}, "Be nice.\nhi"),
        ({"text": "generate from here"}, "generate from here"),
        ({"input_ids": [5, 6]}, "5 6"),
    ],
)
def test_prompt_input_and_text_fields(body: dict, expected: str) -> None:
    assert request_text(body) == expected


@pytest.mark.parametrize(
    "body",
    [None, "string", 42, [], {}, {"messages": "oops"}, {"messages": [None, 3, "x", {"role": 5, "content": {"a": 1}}]},
     {"prompt": [1, "a", None, 2.5, True]}, {"prompt": {"nested": True}}, {"input": [[[[[[[["deep"]]]]]]]]},
     {"messages": [{"content": [{"type": "text", "text": 7}]}]}],
)
def test_odd_shapes_never_raise(body: object) -> None:
    assert isinstance(request_text(body), str)


def test_very_deep_nesting_is_cut_off() -> None:
    deep: list = ["bottom"]
    for _ in range(10_000):
        deep = [deep]
    assert request_text({"prompt": deep}) == ""

"""Stop strings over text deltas, split at every chunk boundary; stop token ids."""

from __future__ import annotations

from typing import Iterator, Sequence

import pytest

from inference.pipeline.stops import StopMatcher, StopTokens

from .splitting import every_split


def reference(text: str, stops: Sequence[str], keep: bool) -> tuple[str, str | None]:
    """The stop string complete first (the longer one at the same end), scanning the whole text."""
    for end in range(1, len(text) + 1):
        ending = [stop for stop in stops if stop and text[:end].endswith(stop)]
        if ending:
            stop = max(ending, key=len)
            return (text[:end] if keep else text[: end - len(stop)]), stop
    return text, None


def three_way_splits(text: str) -> Iterator[list[str]]:
    for first in range(0, len(text) + 1):
        for second in range(first, len(text) + 1):
            yield [text[:first], text[first:second], text[second:]]


def run(matcher: StopMatcher, chunks: list[str]) -> tuple[str, list[str]]:
    sent = [matcher.feed(chunk) for chunk in chunks]
    sent.append(matcher.flush())
    return "".join(sent), sent


CASES = [
    ("Hello world! Bye.", ["world"]),
    ("Hello world! Bye.", ["Bye.", "!"]),
    ("no stop here at all", ["STOP", "end"]),
    ("aaab and more", ["aab"]),  # a prefix of the stop repeats before it
    ("xabcd tail", ["abcd", "bc"]),  # "bc" is complete before "abcd"
    ("xabce tail", ["abcd", "bc"]),
    ("The answer</answer><|im_end|> junk", ["</answer>", "<|im_end|>"]),
    ("你好世界。再见", ["世界", "再"]),
    ("emoji 🙂🙃 stop🙃 after", ["🙃 after", "p🙃"]),
    ("\n\n\nUser:", ["\n\nUser:", "\nUser"]),
    ("ends with a partial sto", ["stop"]),  # held text is released at the end
]


@pytest.mark.parametrize(("text", "stops"), CASES)
@pytest.mark.parametrize("keep", [False, True])
def test_every_split_gives_the_same_output(text: str, stops: list[str], keep: bool) -> None:
    expected, matched = reference(text, stops, keep)
    for chunks in [*every_split(text), *three_way_splits(text)]:
        matcher = StopMatcher(stops, no_stop_trim=keep)
        out, _ = run(matcher, chunks)
        assert (out, matcher.matched) == (expected, matched), chunks


def test_text_that_cannot_start_a_stop_is_sent_at_once() -> None:
    matcher = StopMatcher(["world!"])
    assert matcher.feed("Hello wor") == "Hello "
    assert matcher.feed("k") == "wor" + "k"
    assert matcher.feed("s w") == "s "
    assert matcher.feed("orld!") == ""
    assert matcher.matched == "world!"
    assert matcher.feed("more") == "" and matcher.flush() == ""


def test_held_text_is_at_most_the_longest_stop_less_one() -> None:
    matcher = StopMatcher(["abcdef", "xyz"])
    out = matcher.feed("12345abcde")
    assert out == "12345" and not matcher.stopped
    assert matcher.flush() == "abcde"


def test_without_stops_text_passes_through() -> None:
    matcher = StopMatcher([])
    assert not matcher.active
    assert matcher.feed("anything") == "anything"
    assert matcher.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    matcher = StopMatcher(["", "x"])
    assert matcher.feed("abc") == "abc"


def test_stop_tokens_include_eos_unless_ignore_eos() -> None:
    tokens = StopTokens.build([7, 9], [2])
    assert tokens.find([1, 5, 2, 7]) == 2
    assert StopTokens.build([7, 9], [2], ignore_eos=True).find([1, 5, 2, 7]) == 3
    assert StopTokens.build().find([1, 2, 3]) is None

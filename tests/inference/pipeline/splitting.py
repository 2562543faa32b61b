"""Helpers for the parser tests: run a parser over an output cut at every boundary, and render
the fixture chat templates to get the real wire formats of assistant turns."""

from __future__ import annotations

import itertools
import json
from typing import Any, Callable, Iterator

from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference.pipeline.events import ReasoningDelta, TextDelta, ToolCallDelta
from inference.pipeline.reasoning import ReasoningParser
from inference.pipeline.tools import ToolParser
from standins.fixtures import FIXTURE_MODELS as FIXTURES


Chunking = list[str]


def every_split(text: str) -> Iterator[Chunking]:
    """The whole text, then every two-piece split (each boundary once), then one character at a
    time."""
    yield [text]
    for at in range(1, len(text)):
        yield [text[:at], text[at:]]
    yield list(text)


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


def run_reasoning(make: Callable[[], ReasoningParser], chunks: Chunking) -> tuple[str, str, list[Any]]:
    parser = make()
    events: list[Any] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    return reasoning, content, events


def run_tools(make: Callable[[], ToolParser], chunks: Chunking) -> tuple[str, list[tuple[str, str, str]], list[Any]]:
    parser = make()
    events: list[Any] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ToolCallDelta):
            if event.name is not None:
                assert event.index == len(calls), "calls start in order, name first"
                assert event.id
                calls[event.index] = [event.id, event.name, ""]
            else:
                assert event.id is None and event.index in calls
            calls[event.index][2] += event.arguments_delta
    for _, _, arguments in calls.values():
        assert isinstance(json.loads(arguments), dict)
    return content, [(c[0], c[1], c[2]) for c in calls.values()], events


def render_fixture(folder: str, template_file: str | None, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """Render a fixture chat template the Hugging Face way (sandboxed, trim/lstrip blocks)."""
    directory = FIXTURES / folder
    if template_file:
        source = (directory / template_file).read_text()
    else:
        source = json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source).render(messages=messages, bos_token="", eos_token="</s>", **kwargs)


def assistant_turn(rendered_with: str, rendered_without: str, suffix: str = "") -> str:
    """What the template writes for the last assistant turn: the difference between rendering the
    conversation with it and without it, minus the end-of-turn suffix."""
    assert rendered_with.startswith(rendered_without)
    turn = rendered_with[len(rendered_without) :]
    return turn.removesuffix(suffix) if suffix else turn

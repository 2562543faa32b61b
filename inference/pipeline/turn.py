"""One model turn, typed: what every served surface's mapper builds from its own request (the chat
schema, Responses, Messages) and the pipeline consumes (render → tokenize → generate → parse).

A :class:`Turn` is frozen and complete: the messages as the chat template reads them, the tools and
tool choice resolved once, the engine's sampling (stops, limits, constraint), how the template is
rendered (thinking, template kwargs, continuing the final message, the response format it may
mention) and how the output is read (reasoning separated or not, stop strings trimmed or not). No
stage reads a surface's request body: a surface's fields reach the pipeline only through its mapper.

:func:`chat_turn` is the chat schema's mapper (POST /v1/chat/completions: the validated body);
responses_api.to_chat and inference.served.messages map their own requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from inference.pipeline.sampling import chat_sampling
from inference.pipeline.templates import ThinkingControl
from inference.pipeline.tool_choice import ToolChoice, resolve_tool_choice
from inference.upstreams.engine import SamplingParams

__all__ = ["OutputOptions", "TemplateOptions", "Turn", "chat_turn"]


@dataclass(frozen=True, slots=True)
class TemplateOptions:
    """How the chat template renders the turn, beyond its messages and tools."""

    thinking: ThinkingControl = field(default_factory=ThinkingControl)
    chat_template_kwargs: Mapping[str, Any] | None = None
    continue_final_message: bool = False  # the last (assistant) message is continued, no new turn opened
    response_format: Mapping[str, Any] | None = None  # some templates describe it to the model


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """How the engine's output is read back."""

    separate_reasoning: bool = True  # the reasoning parser splits reasoning from content
    stream_reasoning: bool = True  # reasoning is streamed as it comes (else held to the end)
    no_stop_trim: bool = False  # a matched stop string stays in the text


@dataclass(frozen=True, slots=True)
class Turn:
    """One model turn (see the module's docstring)."""

    model: str
    messages: Sequence[Mapping[str, Any]]
    tool_choice: ToolChoice
    sampling: SamplingParams
    stream: bool
    template: TemplateOptions = field(default_factory=TemplateOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    prompt_param: str = "messages"  # the request field a prompt of no tokens is blamed on


def chat_turn(body: Mapping[str, Any], model: str, *, stream: bool) -> Turn:
    """The turn of a validated chat completion body (inference.schemas.chat)."""
    choice = resolve_tool_choice(body)
    get = body.get
    return Turn(
        model=model,
        messages=body["messages"],
        tool_choice=choice,
        sampling=chat_sampling(body, choice if choice.constrained else None),
        stream=stream,
        template=TemplateOptions(
            thinking=ThinkingControl.from_request(get("thinking"), get("reasoning_effort")),
            chat_template_kwargs=get("chat_template_kwargs"),
            continue_final_message=get("continue_final_message") is True,
            response_format=get("response_format"),
        ),
        output=OutputOptions(
            separate_reasoning=get("separate_reasoning") is not False,
            stream_reasoning=get("stream_reasoning") is not False,
            no_stop_trim=get("no_stop_trim") is True,
        ),
    )

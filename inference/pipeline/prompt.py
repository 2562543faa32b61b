"""Stages "render → tokenize → context check": a request's prompt as token ids for the engine.

- :func:`render_turn` renders a :class:`~inference.pipeline.turn.Turn` with the model's chat template (sandboxed,
  compiled once per model; the thinking-control and chat_template_kwargs rules of
  :mod:`inference.pipeline.templates`), the tools as :mod:`inference.pipeline.tool_choice`
  resolved them;
- :func:`tokenize` encodes it without adding special tokens the template already wrote (long
  prompts off the event loop);
- :func:`check_prompt` refuses, before dispatch, a prompt the engines would refuse: one of no
  token at all (400, code 400, the field it came from as param) or one that leaves no room in the
  model's window (400 context_length_exceeded, param null).
"""

from __future__ import annotations

from functools import partial

from common import tracing
from inference import errors
from inference.pipeline.templates import ChatTemplateError, RenderedPrompt, TemplateCompileError, render
from inference.pipeline.encode_cache import encode_cache
from inference.pipeline.tokenizers import ModelTokenizer, off_loop
from inference.pipeline.turn import Turn
from inference.schemas.families import ModelFamily

__all__ = ["render_turn", "tokenize", "check_prompt"]


def render_turn(turn: Turn, tokenizer: ModelTokenizer, family: ModelFamily | None) -> RenderedPrompt:
    """The prompt text of a turn. Raises GatewayError (400 process_messages_failed or
    unsupported_content_part; 500 for a model without a usable template)."""
    template = tokenizer.chat_template
    choice = turn.tool_choice
    options = turn.template
    try:
        if template is None:
            raise TemplateCompileError(f"the tokenizer at {tokenizer.path} has no chat template")
        return render(
            template,
            turn.messages,
            tools=choice.tools if choice.parses_calls else None,
            add_generation_prompt=not options.continue_final_message,
            continue_final_message=options.continue_final_message,
            chat_template_kwargs=options.chat_template_kwargs,
            thinking=options.thinking,
            tool_choice=choice.template_value() if choice.parses_calls else None,
            response_format=options.response_format,
            family=family,
        )
    except ChatTemplateError as error:
        raise error.as_gateway_error() from None


async def tokenize(tokenizer: ModelTokenizer, text: str, *, add_special_tokens: bool = False) -> tuple[int, ...]:
    """Token ids of ``text``, from the encode cache when it has them (long texts encoded off the
    event loop); raises GatewayError 500 tokenization_failed. Under --enable-trace: a tokenize span."""
    span = tracing.child("tokenize", {"gateway.tokenizer": tokenizer.path}) if tracing.ENABLED else None
    try:
        cache = encode_cache()
        found = cache.lookup(tokenizer, text, add_special_tokens)
        if found is not None:
            return found
        try:
            if len(text) < tokenizer.offload_chars:
                return cache.encode(tokenizer, text, add_special_tokens, partial(tokenizer.encode, add_special_tokens=add_special_tokens))
            released = partial(tokenizer.encode_released, add_special_tokens=add_special_tokens)
            return await off_loop(partial(cache.encode, tokenizer, text, add_special_tokens, released))
        except Exception as error:  # the tokenizers library raises plain exceptions
            raise errors.tokenization_failed(str(error)) from None
    finally:
        if span is not None:
            span.end()


def check_prompt(prompt_tokens: int, context_length: int | None, param: str) -> None:
    """400 for a prompt the engines refuse (their INVALID_ARGUMENT), before it reaches one: no token
    at all (an empty string, or a text the tokenizer encodes to nothing; code 400, ``param`` the
    request field it came from), or context_length_exceeded when it fills the window (no token left
    to generate)."""
    if not prompt_tokens:
        raise errors.invalid_request(f"{param} must not be empty: it encodes to no tokens", param)
    if context_length is not None and prompt_tokens >= context_length:
        raise errors.context_length_exceeded(prompt_tokens, context_length)

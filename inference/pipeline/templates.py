"""The render stage: a chat request's messages → the prompt text, through the model's chat template.

Templates run the way Hugging Face ``apply_chat_template`` runs them (the engines do the same): a
sandboxed Jinja2 environment (``ImmutableSandboxedEnvironment``, ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension and a pass-through ``{% generation %}`` tag), the
globals ``raise_exception`` and ``strftime_now``, a ``tojson`` filter that is ``json.dumps`` with
``ensure_ascii=False`` and the ``indent`` / ``separators`` / ``sort_keys`` options, and the special
tokens of tokenizer_config.json (``bos_token``, ``eos_token``, ...) as variables. One environment
serves every model; each template text is compiled once (:func:`compile_template` caches by text).

:func:`render` adds what the gateway decides (spec 1, "Thinking control"; the ``chat_template_kwargs``
row): the thinking toggle the template reads (``enable_thinking`` or ``thinking``), the effective
``reasoning_effort``, ``tool_choice`` and ``response_format``; an explicit ``chat_template_kwargs``
entry wins over each of them. ``continue_final_message`` cuts the prompt right after the final
assistant message's text, as Hugging Face does, so the model continues it.

A template that fails while rendering (``raise_exception`` included) raises :class:`TemplateRenderError`
(400 ``process_messages_failed``); a template that does not compile raises
:class:`TemplateCompileError` when the tokenizer is loaded.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

import jinja2
import jinja2.meta
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from inference.errors import GatewayError
from inference.schemas.families import ModelFamily, family_info

__all__ = [
    "ChatTemplate", "ChatTemplateError", "ContentFormat", "RenderedPrompt", "TemplateCompileError",
    "TemplateRenderError", "ThinkingControl", "UnsupportedContentPart", "compile_template",
    "decide_thinking", "detect_content_format", "prepare_messages", "render", "template_kwargs",
]  # fmt: skip

RESERVED_KWARGS = frozenset(("messages", "tools", "documents", "add_generation_prompt", "continue_final_message"))
"""Template variables the request's own fields set; a ``chat_template_kwargs`` entry cannot."""

_THINKING_TOGGLES = ("enable_thinking", "thinking")  # the variables templates read the toggle from
_EFFORT_OFF = frozenset(("none", "minimal"))


# --- errors --------------------------------------------------------------------------------------


class ChatTemplateError(Exception):
    """A prompt could not be built from the request; ``status`` and ``code`` are the answer's."""

    status = 400
    code = "process_messages_failed"

    def as_gateway_error(self) -> GatewayError:
        return GatewayError(self.status, self.code, str(self), param=None)


class TemplateRenderError(ChatTemplateError):
    """The template refused the messages (``raise_exception``) or failed on them."""


class UnsupportedContentPart(ChatTemplateError):
    """A content part the template cannot take (a non-text part for a text-only template)."""

    code = "unsupported_content_part"


class TemplateCompileError(ChatTemplateError):
    """The chat template is not valid Jinja2 (a model-configuration error, not the client's)."""

    status = 500
    code = "chat_template_invalid"


class _RaisedByTemplate(jinja2.TemplateError):
    """What the ``raise_exception`` global raises."""


# --- the environment (one for all models) ---------------------------------------------------------


class _GenerationTag(Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}`` (assistant-token masks): the body
    renders unchanged; the masks are not used here."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return list(parser.parse_statements(("name:endgeneration",), drop_needle=True))


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


_now = datetime.now  # the clock of strftime_now (tests fix it)


def _strftime_now(format: str) -> str:
    return _now().strftime(format)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters and takes only indent; templates expect json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_PLAIN_TYPES = frozenset((str, dict, list, tuple, int, float, bool, type(None), LoopContext, Namespace))
# A loop's counters (ints and bools) and a string's methods but the two the sandbox wraps: a value
# the sandbox returns as it is once the attribute is known safe (_Sandbox.getattr).
_LOOP_NUMBERS = frozenset(("index0", "index", "revindex0", "revindex", "first", "last", "length", "depth0", "depth"))
_FORMATS = frozenset(("format", "format_map"))
_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Sandbox(ImmutableSandboxedEnvironment):
    """``ImmutableSandboxedEnvironment`` with its checks answered faster where the answer is known
    without them, the same answers (D87): a template reads the messages (plain dicts, lists and
    strings) and calls their methods on every request, and each access paid the full check.

    - whether an attribute of a plain value (``str``, ``dict``, ``list``, ..., a ``loop`` or a
      ``namespace()``) is safe depends only on its type and the name (the checks are ``isinstance``
      tests and the name's prefix): kept per (type, name) once asked;
    - a name a plain ``dict`` has no attribute of (``message.content``) is its item at once: the
      lookup the sandbox tries first can only fail (a ``dict`` instance has no attributes of its own);
    - a built-in method (``content.split``) is always safe to call: it cannot carry the
      ``unsafe_callable`` or ``alters_data`` marks the sandbox looks for;
    - a loop's counter (``loop.index0``, an int or a bool) or a string's method (``startswith``;
      not ``format`` or ``format_map``, which the sandbox wraps) known safe is returned as it is:
      what the sandbox's checks would return for it (D114).
    """

    _safe: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if (
            (kind is LoopContext and attribute in _LOOP_NUMBERS or kind is str and attribute not in _FORMATS)
            and self._safe.get((kind, attribute))
        ):  # fmt: skip
            try:
                return getattr(obj, attribute)
            except AttributeError:
                pass
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if kind not in _PLAIN_TYPES:
            return super().is_safe_attribute(obj, attr, value)
        key = (kind, attr)
        safe = self._safe.get(key)
        if safe is None:
            safe = super().is_safe_attribute(obj, attr, value)
            if len(self._safe) < 4096:
                self._safe[key] = safe
        return safe

    def is_safe_callable(self, obj: Any) -> bool:
        return type(obj) is types.BuiltinMethodType or super().is_safe_callable(obj)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=128)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template for ``source`` (cached by text: each template compiles once)."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateCompileError(f"chat template does not compile: {error}") from error


@lru_cache(maxsize=128)
def _template_globals(source: str) -> tuple[dict[str, Any], set[str]]:
    """The globals of ``source``'s compiled template as a plain dict, and their names: read once from
    the template's ``ChainMap`` over the environment's globals (set before any template compiles),
    which ``Template.render`` copies item by item in Python on every call."""
    values = dict(compile_template(source).globals)
    return values, set(values)


def _render_text(source: str, compiled: jinja2.Template, context: dict[str, Any]) -> str:
    """``compiled.render(context)`` (``compiled``: ``source``'s template): the same context (the
    globals, then ``context`` over them) built from :func:`_template_globals`, the same render and
    error handling."""
    environment = compiled.environment
    values, names = _template_globals(source)
    ctx = environment.context_class(environment, {**values, **context}, compiled.name, compiled.blocks)
    ctx.globals_keys = names
    try:
        return environment.concat(compiled.root_render_func(ctx))
    except Exception:
        environment.handle_exception()


@lru_cache(maxsize=128)
def _variables_read(source: str) -> frozenset[str]:
    """The variables the template reads from its context (``enable_thinking``, ``reasoning_effort``)."""
    return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(source)))


# --- content format (vLLM's and the reference gateway's detection, simplified) --------------------


class ContentFormat(StrEnum):
    STRING = "string"  # message content is one string; text parts are joined
    OPENAI = "openai"  # the template iterates over the content parts itself


def _is_content(node: nodes.Node, message_vars: set[str]) -> bool:
    """``m.content`` / ``m['content']`` for a loop variable ``m`` over messages, or a variable
    named ``content``."""
    if isinstance(node, nodes.Name):
        return node.name == "content"
    if isinstance(node, nodes.Getattr):
        return node.attr == "content" and isinstance(node.node, nodes.Name) and node.node.name in message_vars
    if isinstance(node, nodes.Getitem):
        key = node.arg
        return (
            isinstance(key, nodes.Const)
            and key.value == "content"
            and isinstance(node.node, nodes.Name)
            and node.node.name in message_vars
        )
    if isinstance(node, nodes.Filter) and node.node is not None:
        return _is_content(node.node, message_vars)
    return False


@lru_cache(maxsize=128)
def detect_content_format(source: str) -> ContentFormat:
    """OPENAI when the template loops over a message's content (``{% for part in message.content %}``)
    or indexes it by number; STRING otherwise (the common case, and the safe one)."""
    try:
        tree = _environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return ContentFormat.STRING
    message_vars = {"message", "msg", "m"}
    for loop in tree.find_all(nodes.For):
        if isinstance(loop.iter, nodes.Name) and loop.iter.name in ("messages", "loop_messages"):
            if isinstance(loop.target, nodes.Name):
                message_vars.add(loop.target.name)
    for loop in tree.find_all(nodes.For):
        if _is_content(loop.iter, message_vars):
            return ContentFormat.OPENAI
    for item in tree.find_all(nodes.Getitem):
        if isinstance(item.arg, nodes.Const) and type(item.arg.value) is int and _is_content(item.node, message_vars):
            return ContentFormat.OPENAI
    return ContentFormat.STRING


# --- the template of one model --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A model's chat template(s), compiled, with the special-token variables it renders with.

    ``sources`` maps a name to template text: ``default``, and ``tool_use`` where the model has a
    separate template for requests with tools (Hugging Face's named templates).
    """

    sources: Mapping[str, str]
    special_tokens: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls, source: str | Sequence[Mapping[str, str]], special_tokens: Mapping[str, Any] | None = None
    ) -> ChatTemplate:
        """From a template text or Hugging Face's list of ``{name, template}``; compiles each now."""
        if isinstance(source, str):
            sources = {"default": source}
        else:
            sources = {str(item["name"]): str(item["template"]) for item in source}
            if "default" not in sources:
                raise TemplateCompileError("the chat templates have no 'default' template")
        for text in sources.values():
            compile_template(text)
        # Unset special tokens stay undefined, as in Hugging Face's special_tokens_map (not "None").
        tokens = {name: value for name, value in (special_tokens or {}).items() if value is not None}
        return cls(sources=sources, special_tokens=tokens)

    def source_for(self, has_tools: bool) -> str:
        if has_tools and "tool_use" in self.sources:
            return self.sources["tool_use"]
        return self.sources["default"]


@dataclass(frozen=True, slots=True)
class ThinkingControl:
    """What the request says about thinking: ``thinking.type`` (enabled, disabled, adaptive), the
    effective effort (``thinking.effort``, else ``reasoning_effort``) and ``thinking.clear_thinking``."""

    type: str | None = None
    effort: str | None = None
    clear_thinking: bool | None = None

    @classmethod
    def from_request(cls, thinking: Mapping[str, Any] | None, reasoning_effort: str | None) -> ThinkingControl:
        thinking = thinking or {}
        effort = thinking.get("effort")
        if effort is None:
            effort = reasoning_effort
        clear = thinking.get("clear_thinking")
        return cls(
            type=thinking.get("type"),
            effort=effort if isinstance(effort, str) else None,
            clear_thinking=clear if type(clear) is bool else None,
        )


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """The prompt text, and the thinking mode decided for it (None: the template's default)."""

    text: str
    thinking: bool | None = None


# --- thinking control and template variables ------------------------------------------------------


def _clamp_effort(effort: str, levels: tuple[str, ...]) -> str:
    """A three-level family's clamp (spec 1): none, minimal → the lowest; xhigh, max → the highest;
    an unknown value → the middle one."""
    if effort in levels:
        return effort
    if effort in _EFFORT_OFF:
        return levels[0]
    if effort in ("xhigh", "max"):
        return levels[-1]
    return levels[len(levels) // 2]


def decide_thinking(
    kwargs: Mapping[str, Any],
    control: ThinkingControl,
    *,
    own_effort_levels: bool,
    native_levels: tuple[str, ...] = (),
    default: bool | None = None,
) -> bool | None:
    """The thinking mode by the first rule that applies (spec 1, Thinking control, gRPC workers);
    None when no rule applies and the template's default stands."""
    for key in _THINKING_TOGGLES:  # 1. an explicit toggle in chat_template_kwargs
        toggle = kwargs.get(key)
        if type(toggle) is bool:
            return toggle
    if own_effort_levels:  # 2. templates with their own effort levels
        effort = kwargs.get("reasoning_effort", control.effort)
        if isinstance(effort, str):
            if effort in _EFFORT_OFF:
                return False
            if not native_levels or effort in native_levels:
                return True
    if control.type == "enabled":  # 3. thinking.type
        return True
    if control.type == "disabled":
        return False
    if control.effort in _EFFORT_OFF:  # 4. the effective effort
        return False
    return default


def template_kwargs(
    template_source: str,
    *,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    thinking: ThinkingControl | None = None,
    tool_choice: Any = None,
    response_format: Any = None,
    family: ModelFamily | None = None,
) -> tuple[dict[str, Any], bool | None]:
    """The extra template variables of one request, and the thinking mode they set.

    The gateway's values (the thinking toggle under the name the template reads, the effective
    ``reasoning_effort``, ``tool_choice``, ``response_format``, ``clear_thinking``) come first; an
    explicit ``chat_template_kwargs`` entry wins over each.
    """
    explicit = {k: v for k, v in (chat_template_kwargs or {}).items() if k not in RESERVED_KWARGS}
    control = thinking or ThinkingControl()
    reads = _variables_read(template_source)
    info = family_info(family) if family is not None else None
    levels = info.effort_levels if info is not None else ()
    decided = decide_thinking(
        explicit,
        control,
        own_effort_levels="reasoning_effort" in reads or bool(levels),
        native_levels=levels,
        default=info.thinking_default if info is not None else None,
    )
    values: dict[str, Any] = {}
    if control.effort is not None:
        values["reasoning_effort"] = _clamp_effort(control.effort, levels) if levels else control.effort
    if tool_choice is not None:
        values["tool_choice"] = tool_choice
    if response_format is not None:
        values["response_format"] = response_format
    if control.clear_thinking is not None:
        values["clear_thinking"] = control.clear_thinking
    if decided is not None:
        for name in _THINKING_TOGGLES:
            if name in reads:
                values[name] = decided
    values.update(explicit)
    return values, decided


# --- messages as the template takes them ----------------------------------------------------------


def _text_of(content: Any, index: int) -> Any:
    """String content for a text-only template: text parts joined by newlines."""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    for position, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        text = part.get("text") if isinstance(part, Mapping) else None
        if kind in ("text", "input_text", "output_text") and isinstance(text, str):
            texts.append(text)
        else:
            raise UnsupportedContentPart(
                f"messages[{index}].content[{position}]: content part type {kind!r} is not supported by this model's "
                "chat template"
            )
    return "\n".join(texts)


def _arguments(arguments: Any, as_text: bool) -> Any:
    if as_text:
        if isinstance(arguments, str):
            return arguments
        return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # not JSON: the template sees the text as sent
    return arguments if arguments is not None else {}


def _tool_calls(calls: Any, as_text: bool) -> Any:
    if not isinstance(calls, list):
        return calls
    converted: list[Any] = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or "arguments" not in function:
            converted.append(call)
            continue
        converted.append({**call, "function": {**function, "arguments": _arguments(function["arguments"], as_text)}})
    return converted


def prepare_messages(
    messages: Iterable[Mapping[str, Any]],
    content_format: ContentFormat = ContentFormat.STRING,
    *,
    tool_arguments_as_text: bool = False,
) -> list[dict[str, Any]]:
    """Messages as chat templates read them (the input is not changed).

    - content parts become one string for a text-only template (text parts joined by ``\\n``);
    - a tool call's ``arguments`` become a dict (Hugging Face's convention: Llama, Mistral, Qwen,
      gpt-oss), or stay JSON text for the templates that concatenate them (DeepSeek);
    - ``reasoning`` is the alias of ``reasoning_content``.
    """
    prepared: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        item = dict(message)
        if content_format is ContentFormat.STRING and isinstance(item.get("content"), list):
            item["content"] = _text_of(item["content"], index)
        if "tool_calls" in item and item["tool_calls"] is not None:
            item["tool_calls"] = _tool_calls(item["tool_calls"], tool_arguments_as_text)
        if "reasoning" in item and "reasoning_content" not in item:
            item["reasoning_content"] = item.pop("reasoning")
        prepared.append(item)
    return prepared


# --- render ---------------------------------------------------------------------------------------


def _final_text(messages: Sequence[Mapping[str, Any]]) -> str:
    if not messages or messages[-1].get("role") != "assistant":
        raise TemplateRenderError("continue_final_message needs a final assistant message")
    content = messages[-1].get("content")
    if isinstance(content, list):
        for part in reversed(content):
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                return str(part["text"])
        raise TemplateRenderError("continue_final_message: the final message has no text to continue")
    if not isinstance(content, str):
        raise TemplateRenderError("continue_final_message: the final message has no text to continue")
    return content


def _cut_after_final_message(rendered: str, final: str) -> str:
    """Hugging Face's continue_final_message: end the prompt where the final message's text ends
    (its end-of-turn marker and anything after it removed), keeping trailing spaces the template
    kept."""
    stripped = final.strip()
    if not stripped:
        return rendered
    at = rendered.rfind(stripped)
    if at < 0:
        raise TemplateRenderError(
            "continue_final_message: the final message does not appear in the rendered prompt"
        )
    kept = final.lstrip()
    if rendered[at : at + len(kept)] == kept:
        return rendered[: at + len(kept)]
    return rendered[: at + len(stripped)]


def render(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    thinking: ThinkingControl | None = None,
    tool_choice: Any = None,
    response_format: Any = None,
    family: ModelFamily | None = None,
) -> RenderedPrompt:
    """Render ``messages`` (OpenAI chat form) into the prompt text.

    ``continue_final_message`` continues the trailing assistant message: no generation prompt is
    added, and the prompt ends with that message's text. ``tools`` are the request's tool
    declarations as sent (``{"type": "function", "function": {...}}``); ``documents`` are passed
    as Hugging Face passes them (RAG templates). Raises :class:`ChatTemplateError`.
    """
    has_tools = bool(tools)
    source = template.source_for(has_tools)
    compiled = compile_template(source)
    info = family_info(family) if family is not None else None
    prepared = prepare_messages(
        messages,
        detect_content_format(source),
        tool_arguments_as_text=info.tool_arguments_as_text if info is not None else False,
    )
    extra, decided = template_kwargs(
        source,
        chat_template_kwargs=chat_template_kwargs,
        thinking=thinking,
        tool_choice=tool_choice,
        response_format=response_format,
        family=family,
    )
    context: dict[str, Any] = {**template.special_tokens, **extra}
    context.update(
        messages=prepared,
        tools=list(tools) if tools else None,
        documents=list(documents) if documents else None,
        add_generation_prompt=add_generation_prompt and not continue_final_message,
    )
    try:
        text = _render_text(source, compiled, context)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as error:
        raise TemplateRenderError(f"chat template error: {error.message or error}") from error
    except Exception as error:  # a template fails on data it does not expect (str + dict, None.strip)
        raise TemplateRenderError(f"chat template failed on these messages: {type(error).__name__}: {error}") from error
    if continue_final_message:
        text = _cut_after_final_message(text, _final_text(prepared))
    return RenderedPrompt(text=text, thinking=decided)

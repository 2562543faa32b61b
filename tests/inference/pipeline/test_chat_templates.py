"""Golden rendered prompts for every fixture family, and the render stage's rules.

Each case gives the request as a client sends it (OpenAI form: tool-call arguments as JSON text,
content parts, the thinking fields) to :func:`render`, and, separately, the template-ready
variables written by hand for an independent rendering: a plain ``jinja2.Environment`` set up
here, with ``json.dumps`` as ``tojson`` (what Hugging Face's ``apply_chat_template`` does). Both
must equal the checked-in file in ``golden/`` (regenerate the files from the independent
rendering with ``UPDATE_GOLDEN=1``), and the prompt's token ids must decode back to it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import pytest

from inference.pipeline import templates
from inference.pipeline.templates import (
    ChatTemplate,
    ContentFormat,
    TemplateRenderError,
    ThinkingControl,
    UnsupportedContentPart,
    decide_thinking,
    detect_content_format,
    prepare_messages,
    render,
)
from inference.pipeline.tokenizers import ModelTokenizer, load_tokenizer
from inference.schemas.families import ModelFamily

from .splitting import FIXTURES

GOLDEN = Path(__file__).parent / "golden"
FIXED_NOW = datetime(2025, 3, 14, 15, 9, 26)


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates, "_now", lambda: FIXED_NOW)


# --- the independent rendering -----------------------------------------------------------------


def _independent(source: str, variables: dict[str, Any]) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(value: Any, indent: Any = None, **options: Any) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent, **options)

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: FIXED_NOW.strftime(fmt)
    return env.from_string(source).render(**variables)


def _config(folder: str) -> dict[str, Any]:
    return json.loads((FIXTURES / folder / "tokenizer_config.json").read_text(encoding="utf-8"))


def _token(value: Any) -> Any:
    return value["content"] if isinstance(value, dict) else value


def _special(folder: str) -> dict[str, Any]:
    config = _config(folder)
    return {"bos_token": _token(config.get("bos_token")), "eos_token": _token(config.get("eos_token"))}


@dataclass(frozen=True)
class Template:
    folder: str
    file: str | None  # None: tokenizer_config.json's chat_template
    tokenizer: bool = True  # the folder has a tokenizer.json

    def source(self) -> str:
        if self.file is None:
            return str(_config(self.folder)["chat_template"])
        return (FIXTURES / self.folder / self.file).read_text(encoding="utf-8")


LLAMA31 = Template("llama3", None)
LLAMA32 = Template("llama3", "chat_template.llama-3.2.jinja")
QWEN3 = Template("qwen3", None)
MISTRAL = Template("mistral", None)
DEEPSEEK_R1 = Template("deepseek-r1", None)
DEEPSEEK_V31 = Template("deepseek-r1", "chat_template.deepseek-v3.1.jinja")
DEEPSEEK_DISTILL = Template("deepseek-r1", "chat_template.deepseek-r1-distill.jinja")
GPT_OSS = Template("gpt-oss", "chat_template.jinja", tokenizer=False)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}
CHAT = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Say hello in three languages."},
    {"role": "assistant", "content": "Hello! Bonjour! こんにちは!"},
    {"role": "user", "content": [{"type": "text", "text": "Now with an emoji"}, {"type": "text", "text": "please 🙂"}]},
]
CHAT_PLAIN = [  # what the template sees for CHAT: the parts joined by a newline
    *CHAT[:3],
    {"role": "user", "content": "Now with an emoji\nplease 🙂"},
]


def _tool_turns(call_id: str, arguments_as_text: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(request messages, template-ready messages) of a weather tool round trip."""
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
    ready_call = {
        **call,
        "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}' if arguments_as_text else {"city": "Zürich"}},
    }
    request = [
        {"role": "user", "content": "What's the weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"temperature_c": 21}'},
    ]
    ready = [request[0], {**request[1], "tool_calls": [ready_call]}, request[2]]
    return request, ready


@dataclass(frozen=True)
class Case:
    name: str
    template: Template
    family: ModelFamily | None
    messages: list[dict[str, Any]]  # as the client sends them
    ready: list[dict[str, Any]]  # as the template takes them (independent rendering)
    render_args: dict[str, Any] = field(default_factory=dict)  # for render()
    variables: dict[str, Any] = field(default_factory=dict)  # for the independent rendering
    continue_final: bool = False


def _cases() -> list[Case]:
    llama_tools, llama_ready = _tool_turns("call_1", arguments_as_text=False)
    mistral_tools, mistral_ready = _tool_turns("abcDEF123", arguments_as_text=False)
    deepseek_tools, deepseek_ready = _tool_turns("call_1", arguments_as_text=True)
    qwen_history = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple arithmetic."},
        {"role": "user", "content": "And 3+3?"},
    ]
    r1_history = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>Simple arithmetic.</think>The answer is 4."},
        {"role": "user", "content": "Und auf Deutsch?"},
    ]
    continued = [
        {"role": "user", "content": "Write a haiku about the sea."},
        {"role": "assistant", "content": "Waves fold into foam "},
    ]
    # gpt-oss tests `"<|channel|>" in message.content`: its assistant turns need string content.
    oss_tools = [llama_tools[0], {**llama_tools[1], "content": ""}, llama_tools[2]]
    oss_ready = [llama_ready[0], {**llama_ready[1], "content": ""}, llama_ready[2]]
    gen = {"add_generation_prompt": True}
    return [
        Case("llama3.1-chat", LLAMA31, ModelFamily.LLAMA, CHAT, CHAT_PLAIN, variables=gen),
        Case(
            "llama3.1-tools", LLAMA31, ModelFamily.LLAMA, llama_tools, llama_ready,
            {"tools": [WEATHER_TOOL]}, {**gen, "tools": [WEATHER_TOOL]},
        ),
        Case(
            "llama3.1-continue", LLAMA31, ModelFamily.LLAMA, continued, continued,
            {"continue_final_message": True}, continue_final=True,
        ),
        Case("llama3.2-chat", LLAMA32, ModelFamily.LLAMA, CHAT, CHAT_PLAIN, variables=gen),
        Case(
            "llama3.2-tools", LLAMA32, ModelFamily.LLAMA, llama_tools, llama_ready,
            {"tools": [WEATHER_TOOL]}, {**gen, "tools": [WEATHER_TOOL]},
        ),
        Case("qwen3-chat", QWEN3, ModelFamily.QWEN3, CHAT, CHAT_PLAIN, variables=gen),
        Case(
            "qwen3-thinking-off", QWEN3, ModelFamily.QWEN3, CHAT, CHAT_PLAIN,
            {"thinking": ThinkingControl(type="disabled")}, {**gen, "enable_thinking": False},
        ),
        Case(
            "qwen3-effort-none", QWEN3, ModelFamily.QWEN3, qwen_history, qwen_history,
            {"thinking": ThinkingControl(effort="none")}, {**gen, "enable_thinking": False},
        ),
        Case(
            "qwen3-tools", QWEN3, ModelFamily.QWEN3, llama_tools, llama_ready,
            {"tools": [WEATHER_TOOL]}, {**gen, "tools": [WEATHER_TOOL]},
        ),
        Case(
            "qwen3-continue", QWEN3, ModelFamily.QWEN3, continued, continued,
            {"continue_final_message": True}, continue_final=True,
        ),
        Case("mistral-chat", MISTRAL, ModelFamily.MISTRAL, CHAT, CHAT_PLAIN, variables=gen),
        Case(
            "mistral-tools", MISTRAL, ModelFamily.MISTRAL, mistral_tools, mistral_ready,
            {"tools": [WEATHER_TOOL]}, {**gen, "tools": [WEATHER_TOOL]},
        ),
        Case(
            "mistral-continue", MISTRAL, ModelFamily.MISTRAL, continued, continued,
            {"continue_final_message": True}, continue_final=True,
        ),
        Case("deepseek-r1-chat", DEEPSEEK_R1, ModelFamily.DEEPSEEK_R1, CHAT, CHAT_PLAIN, variables=gen),
        Case("deepseek-r1-history", DEEPSEEK_R1, ModelFamily.DEEPSEEK_R1, r1_history, r1_history, variables=gen),
        Case(
            "deepseek-r1-tools", DEEPSEEK_R1, ModelFamily.DEEPSEEK_R1, deepseek_tools, deepseek_ready,
            {"tools": [WEATHER_TOOL]}, {**gen, "tools": [WEATHER_TOOL]},
        ),
        Case("deepseek-v3.1-chat", DEEPSEEK_V31, ModelFamily.DEEPSEEK_V31, CHAT, CHAT_PLAIN, variables=gen),
        Case(
            "deepseek-v3.1-thinking", DEEPSEEK_V31, ModelFamily.DEEPSEEK_V31, CHAT, CHAT_PLAIN,
            {"chat_template_kwargs": {"enable_thinking": True}},
            {**gen, "thinking": True, "enable_thinking": True},
        ),
        Case(
            "deepseek-v3.1-thinking-type", DEEPSEEK_V31, ModelFamily.DEEPSEEK_V31, CHAT, CHAT_PLAIN,
            {"thinking": ThinkingControl(type="enabled")}, {**gen, "thinking": True},
        ),
        Case(
            "deepseek-v3.1-tools", DEEPSEEK_V31, ModelFamily.DEEPSEEK_V31, deepseek_tools, deepseek_ready,
            {"tools": [WEATHER_TOOL]}, {**gen, "tools": [WEATHER_TOOL]},
        ),
        Case("deepseek-r1-distill-chat", DEEPSEEK_DISTILL, ModelFamily.DEEPSEEK_R1, CHAT, CHAT_PLAIN, variables=gen),
        Case(
            "gpt-oss-chat", GPT_OSS, ModelFamily.GPT_OSS, CHAT, CHAT_PLAIN,
            {"thinking": ThinkingControl(effort="max")}, {**gen, "reasoning_effort": "high"},
        ),
        Case(
            "gpt-oss-tools", GPT_OSS, ModelFamily.GPT_OSS, oss_tools, oss_ready,
            {"tools": [WEATHER_TOOL], "chat_template_kwargs": {"reasoning_effort": "low"}},
            {**gen, "tools": [WEATHER_TOOL], "reasoning_effort": "low"},
        ),
    ]  # fmt: skip


CASES = _cases()


def _expected(case: Case) -> str:
    variables = {**_special(case.template.folder), **case.variables, "messages": case.ready}
    if case.continue_final:
        full = _independent(case.template.source(), {**variables, "add_generation_prompt": False})
        final = str(case.ready[-1]["content"])
        at = full.rindex(final.strip())
        return full[: at + len(final.lstrip())] if full[at:].startswith(final.lstrip()) else full[: at + len(final.strip())]
    return _independent(case.template.source(), variables)


_TOKENIZERS: dict[str, ModelTokenizer] = {}


def _tokenizer(case: Case) -> ModelTokenizer:
    key = f"{case.template.folder}:{case.template.file}"
    if key not in _TOKENIZERS:
        override = str(FIXTURES / case.template.folder / case.template.file) if case.template.file else None
        _TOKENIZERS[key] = load_tokenizer(FIXTURES / case.template.folder, chat_template=override)
    return _TOKENIZERS[key]


def _ours(case: Case) -> str:
    if case.template.tokenizer:
        template = _tokenizer(case).chat_template
        assert template is not None
    else:
        config = _config(case.template.folder)
        template = ChatTemplate.build(case.template.source(), {"bos_token": config["bos_token"], "eos_token": config["eos_token"]})
    return render(template, case.messages, family=case.family, **case.render_args).text


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_rendered_prompt_matches_the_golden_file(case: Case) -> None:
    expected = _expected(case)
    golden = GOLDEN / f"{case.name}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(expected, encoding="utf-8")
    assert golden.read_text(encoding="utf-8") == expected, "the independent rendering changed"
    assert _ours(case) == expected


@pytest.mark.parametrize("case", [c for c in CASES if c.template.tokenizer], ids=lambda c: c.name)
def test_prompt_ids_decode_back_to_the_rendered_prompt(case: Case) -> None:
    tokenizer = _tokenizer(case)
    text = _ours(case)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    if tokenizer.bos_token_id is not None and text.startswith(str(_special(case.template.folder)["bos_token"])):
        assert ids[0] == tokenizer.bos_token_id
        assert ids[1] != tokenizer.bos_token_id, "the BOS was added twice"


# --- the render stage's rules --------------------------------------------------------------------


def _qwen3() -> ChatTemplate:
    template = load_tokenizer(FIXTURES / "qwen3").chat_template
    assert template is not None
    return template


def test_rendered_prompt_reports_the_thinking_decision() -> None:
    template = _qwen3()
    assert render(template, CHAT, family=ModelFamily.QWEN3).thinking is None
    off = render(template, CHAT, family=ModelFamily.QWEN3, thinking=ThinkingControl(type="disabled"))
    assert off.thinking is False and off.text.endswith("<think>\n\n</think>\n\n")


def test_explicit_kwarg_wins_over_thinking_type() -> None:
    rendered = render(
        _qwen3(), CHAT, family=ModelFamily.QWEN3,
        thinking=ThinkingControl(type="disabled"), chat_template_kwargs={"enable_thinking": True},
    )  # fmt: skip
    assert rendered.thinking is True
    assert rendered.text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("kwargs", "control", "own", "levels", "default", "expected"),
    [
        ({"thinking": False}, ThinkingControl(type="enabled"), False, (), None, False),  # rule 1
        ({"enable_thinking": True}, ThinkingControl(effort="none"), False, (), None, True),
        ({}, ThinkingControl(type="enabled", effort="minimal"), True, (), None, False),  # rule 2
        ({"reasoning_effort": "high"}, ThinkingControl(type="disabled"), True, ("low", "high"), None, True),
        ({}, ThinkingControl(type="disabled", effort="xhigh"), True, ("low", "high"), None, False),  # 2 → 3
        ({}, ThinkingControl(type="enabled", effort="none"), False, (), None, True),  # rule 3 before 4
        ({}, ThinkingControl(type="adaptive", effort="none"), False, (), None, False),  # rule 4
        ({}, ThinkingControl(type="adaptive", effort="high"), False, (), None, None),  # template default
        ({}, ThinkingControl(), False, (), True, True),  # profile D: on unless turned off
        ({}, ThinkingControl(type="disabled"), False, (), True, False),
    ],
)
def test_thinking_mode_follows_the_first_applicable_rule(
    kwargs: dict[str, Any], control: ThinkingControl, own: bool, levels: tuple[str, ...], default: bool | None,
    expected: bool | None,
) -> None:  # fmt: skip
    assert decide_thinking(kwargs, control, own_effort_levels=own, native_levels=levels, default=default) is expected


def test_gateway_values_reach_the_template_and_explicit_entries_win() -> None:
    source = "{{ reasoning_effort }}|{{ tool_choice }}|{{ response_format.type }}|{{ clear_thinking }}"
    template = ChatTemplate.build(source)
    rendered = render(
        template, CHAT, thinking=ThinkingControl(effort="low", clear_thinking=False),
        tool_choice="auto", response_format={"type": "json_object"},
    )  # fmt: skip
    assert rendered.text == "low|auto|json_object|False"
    explicit = render(
        template, CHAT, thinking=ThinkingControl(effort="low"), tool_choice="auto",
        response_format={"type": "json_object"},
        chat_template_kwargs={"reasoning_effort": "high", "tool_choice": "none", "response_format": {"type": "text"}},
    )  # fmt: skip
    assert explicit.text == "high|none|text|"


def test_chat_template_kwargs_cannot_replace_the_messages() -> None:
    template = ChatTemplate.build("{{ messages | length }} {{ add_generation_prompt }}")
    rendered = render(template, CHAT, chat_template_kwargs={"messages": [], "add_generation_prompt": False})
    assert rendered.text == "4 True"


def test_raise_exception_is_a_render_error_the_surface_answers_with_400() -> None:
    mistral = load_tokenizer(FIXTURES / "mistral").chat_template
    assert mistral is not None
    with pytest.raises(TemplateRenderError, match="must alternate") as raised:
        render(mistral, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    error = raised.value.as_gateway_error()
    assert (error.status, error.code) == (400, "process_messages_failed")


def test_a_template_failing_on_its_data_is_a_render_error() -> None:
    deepseek = load_tokenizer(FIXTURES / "deepseek-r1").chat_template
    assert deepseek is not None
    messages, _ = _tool_turns("call_1", arguments_as_text=False)
    # Without the family, arguments become a dict, and the DeepSeek template concatenates str + dict.
    with pytest.raises(TemplateRenderError, match="TypeError"):
        render(deepseek, messages)


def test_continue_final_message_needs_a_final_assistant_message() -> None:
    with pytest.raises(TemplateRenderError, match="final assistant message"):
        render(_qwen3(), CHAT, continue_final_message=True)


def test_non_text_parts_are_refused_by_a_text_only_template() -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
    with pytest.raises(UnsupportedContentPart) as raised:
        render(_qwen3(), messages)
    assert raised.value.as_gateway_error().code == "unsupported_content_part"


def test_templates_that_iterate_over_content_parts_get_them_unchanged() -> None:
    source = (
        "{% for message in messages %}{% for part in message.content %}"
        "{% if part.type == 'image_url' %}<image>{% else %}{{ part.text }}{% endif %}{% endfor %}{% endfor %}"
    )
    assert detect_content_format(source) is ContentFormat.OPENAI
    messages = [{"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {}}]}]
    assert render(ChatTemplate.build(source), messages).text == "look: <image>"


@pytest.mark.parametrize("template", [LLAMA31, LLAMA32, QWEN3, MISTRAL, DEEPSEEK_R1, DEEPSEEK_V31, DEEPSEEK_DISTILL, GPT_OSS])
def test_fixture_templates_take_string_content(template: Template) -> None:
    assert detect_content_format(template.source()) is ContentFormat.STRING


def test_prepare_messages_leaves_the_request_unchanged() -> None:
    messages, _ = _tool_turns("call_1", arguments_as_text=False)
    before = json.dumps(messages)
    prepared = prepare_messages(messages)
    assert prepared[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Zürich"}
    assert json.dumps(messages) == before
    as_text = prepare_messages([{**messages[1], "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}], tool_arguments_as_text=True)
    assert as_text[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert prepare_messages([{"role": "assistant", "content": "x", "reasoning": "r"}])[0]["reasoning_content"] == "r"


def test_hf_template_features_compile_and_render() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content | tojson(indent=2, sort_keys=True) }}{% endgeneration %}{% endfor %}"
        "{{ strftime_now('%Y') }}{{ bos_token }}"
    )
    template = ChatTemplate.build(source, {"bos_token": "<s>"})
    rendered = render(template, [{"role": "user", "content": {"b": "é", "a": 1}}, {"role": "user", "content": "x"}])
    assert rendered.text == '{\n  "a": 1,\n  "b": "é"\n}2025<s>'


def test_the_sandbox_refuses_unsafe_access() -> None:
    template = ChatTemplate.build("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}")
    with pytest.raises(TemplateRenderError):
        render(template, CHAT)



_SANDBOX_MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi", "name": "ann"}]


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ("{{ messages.append(1) }}", True),  # mutating methods: of a list, a dict, a namespace's list
        ("{{ messages[0].clear() }}", True),
        ("{{ messages[0].update({'role': 'x'}) }}", True),
        ("{% set ns = namespace(items=[]) %}{{ ns.items.append(1) }}", True),
        ("[{{ messages[0].content._formatter_parser }}]", False),  # private: undefined, rendered empty
        ("[{% for m in messages %}{{ loop.__class__ }}{% endfor %}]", False),
        ("[{{ ''.format.__globals__ }}]", False),
        ("[{{ messages[0].__class__ }}{{ messages[0]._x }}]", False),
    ],
)
def test_the_sandbox_refuses_mutation_and_private_access_every_time(source: str, refused: bool) -> None:
    """The faster sandbox checks (D87) give the stock sandbox's answers, on the first access and once kept."""
    stock = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(source)
    template = ChatTemplate.build(source)
    if refused:
        with pytest.raises(jinja2.exceptions.SecurityError):
            stock.render(messages=_SANDBOX_MESSAGES)
        for _ in range(2):
            with pytest.raises(TemplateRenderError):
                render(template, _SANDBOX_MESSAGES)
        return
    expected = stock.render(messages=_SANDBOX_MESSAGES)
    assert expected.replace("[", "").replace("]", "") == ""
    for _ in range(2):
        assert render(template, _SANDBOX_MESSAGES, add_generation_prompt=False).text == expected


def test_the_sandbox_reads_message_fields_and_dict_methods_as_before() -> None:
    source = (
        "{% for m in messages %}{{ m.role }}:{{ m.content.split(' ')|length }}:{{ m.get('name', '-') }}:"
        "{{ m.items()|list|length }}:{{ m.missing is defined }}:{{ m.keys is defined }}:{{ loop.last }};{% endfor %}"
        "{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{{ '{}-{}'.format(1, 2) }}"
    )
    messages = _SANDBOX_MESSAGES
    stock = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(source).render(messages=messages)
    assert stock.startswith("system:2:-:2:False:True:False;user:2:ann:3:False:True:True;1")
    for _ in range(2):
        assert render(ChatTemplate.build(source), messages, add_generation_prompt=False).text == stock

def test_each_template_text_compiles_once() -> None:
    source = "{{ messages[0].content }}!"
    first = templates.compile_template(source)
    assert templates.compile_template(source) is first
    hits = templates.compile_template.cache_info().hits
    render(ChatTemplate.build(source), CHAT)
    assert templates.compile_template.cache_info().hits > hits

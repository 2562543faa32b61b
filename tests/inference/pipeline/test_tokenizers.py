"""Loading fixture tokenizers, the chat-template precedence, the bounded cache, encoding off the
event loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from inference.pipeline import tokenizers as module
from inference.pipeline.templates import render
from inference.pipeline.tokenizers import TokenizerCache, TokenizerLoadError, load_tokenizer

from .splitting import FIXTURES


def test_fixture_tokenizers_load_with_their_special_tokens() -> None:
    llama = load_tokenizer(FIXTURES / "llama3")
    assert (llama.bos_token_id, llama.eos_token_ids) == (128000, (128009,))
    assert 128010 in llama.special_token_ids  # <|python_tag|>
    qwen = load_tokenizer(FIXTURES / "qwen3" / "tokenizer.json")  # the file itself works too
    assert (qwen.bos_token_id, qwen.eos_token_ids) == (None, (151645,))
    deepseek = load_tokenizer(FIXTURES / "deepseek-r1")
    assert (deepseek.bos_token_id, deepseek.eos_token_ids) == (0, (1,))
    assert llama.chat_template is not None and qwen.chat_template is not None
    assert load_tokenizer(FIXTURES / "whisper-large-v3").chat_template is None


def test_encoding_writes_no_second_bos_and_completions_may_add_it() -> None:
    mistral = load_tokenizer(FIXTURES / "mistral")
    assert mistral.encode("<s>[INST] hi[/INST]")[:2] == [1, 3]
    assert mistral.encode("hi", add_special_tokens=True)[0] == 1
    assert mistral.encode("hi")[0] != 1


def test_generation_config_adds_end_of_sequence_ids(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "llama3" / "tokenizer.json", tmp_path)
    shutil.copy(FIXTURES / "llama3" / "tokenizer_config.json", tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008, 128009]}))
    assert load_tokenizer(tmp_path).eos_token_ids == (128009, 128001, 128008)


def test_chat_template_precedence(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "qwen3" / "tokenizer.json", tmp_path)
    shutil.copy(FIXTURES / "qwen3" / "tokenizer_config.json", tmp_path)
    messages = [{"role": "user", "content": "hi"}]

    def rendered(**kwargs: str) -> str:
        template = load_tokenizer(tmp_path, **kwargs).chat_template
        assert template is not None
        return render(template, messages).text

    assert rendered().startswith("<|im_start|>user")  # tokenizer_config.json
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "json:{{ messages[0].content }}"}))
    assert rendered() == "json:hi"
    (tmp_path / "chat_template.jinja").write_text("jinja:{{ messages[0].content }}")
    assert rendered() == "jinja:hi"
    override = tmp_path / "override.jinja"
    override.write_text("file:{{ messages[0].content }}")
    assert rendered(chat_template=str(override)) == "file:hi"
    assert rendered(chat_template="inline:{{ messages[0].content }}") == "inline:hi"
    with pytest.raises(TokenizerLoadError):
        load_tokenizer(tmp_path, chat_template=str(tmp_path / "missing.jinja"))


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "qwen3" / "tokenizer.json", tmp_path)
    config = {"chat_template": [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_tokenizer(tmp_path).chat_template
    assert template is not None
    messages = [{"role": "user", "content": "hi"}]
    assert render(template, messages).text == "plain"
    assert render(template, messages, tools=[{"type": "function", "function": {"name": "f"}}]).text == "tools"


def test_a_bad_template_or_path_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    shutil.copy(FIXTURES / "qwen3" / "tokenizer.json", tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{% if %}")
    with pytest.raises(TokenizerLoadError, match="does not compile"):
        load_tokenizer(tmp_path)


def test_single_token_stop_strings() -> None:
    qwen = load_tokenizer(FIXTURES / "qwen3")
    assert qwen.single_token_id("<|im_end|>") == 151645
    assert qwen.single_token_id("\n\n") is not None
    assert qwen.single_token_id("two words") is None
    assert qwen.single_token_id("") is None


def test_cache_is_bounded_and_least_recently_used_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    real = module.load_tokenizer

    def counting(path: str, *, chat_template: str | None = None) -> module.ModelTokenizer:
        loads.append(Path(path).name)
        return real(path, chat_template=chat_template)

    monkeypatch.setattr(module, "load_tokenizer", counting)
    cache = TokenizerCache(maxsize=2)
    qwen = cache.get(FIXTURES / "qwen3")
    assert cache.get(FIXTURES / "qwen3") is qwen
    cache.get(FIXTURES / "mistral")
    cache.get(FIXTURES / "qwen3")  # qwen3 is now the most recent
    cache.get(FIXTURES / "deepseek-r1")  # evicts mistral
    assert len(cache) == 2
    assert cache.peek(FIXTURES / "mistral") is None
    assert cache.peek(FIXTURES / "qwen3") is qwen
    assert loads == ["qwen3", "mistral", "deepseek-r1"]
    cache.evict(FIXTURES / "qwen3")
    assert cache.peek(FIXTURES / "qwen3") is None


async def test_concurrent_async_gets_share_one_load(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    release = threading.Event()
    real = module.load_tokenizer

    def slow(path: str, *, chat_template: str | None = None) -> module.ModelTokenizer:
        loads.append(str(path))
        release.wait(5)
        return real(path, chat_template=chat_template)

    monkeypatch.setattr(module, "load_tokenizer", slow)
    cache = TokenizerCache()
    tasks = [asyncio.create_task(cache.aget(FIXTURES / "mistral")) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert cache.loading(FIXTURES / "mistral")
    release.set()
    results = await asyncio.gather(*tasks)
    assert len(loads) == 1 and all(result is results[0] for result in results)
    assert not cache.loading(FIXTURES / "mistral")


async def test_a_failed_load_reaches_every_waiter_and_is_not_cached(tmp_path: Path) -> None:
    cache = TokenizerCache()
    results = await asyncio.gather(cache.aget(tmp_path), cache.aget(tmp_path), return_exceptions=True)
    assert all(isinstance(result, TokenizerLoadError) for result in results)
    assert cache.peek(tmp_path) is None and not cache.loading(tmp_path)


async def test_long_encodes_run_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    qwen = load_tokenizer(FIXTURES / "qwen3")
    short = "hello 你好 " * 10
    long = "The quick brown fox 🦊 jumps. " * 2000  # ~8k tokens
    assert len(long) >= module.OFFLOAD_ENCODE_CHARS > len(short)
    loop_thread = threading.get_ident()
    threads: list[int] = []
    real = module.ModelTokenizer.encode_released

    def recording(self: module.ModelTokenizer, text: str, *, add_special_tokens: bool = False) -> list[int]:
        threads.append(threading.get_ident())
        return real(self, text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(module.ModelTokenizer, "encode_released", recording)
    assert await qwen.aencode(short) == qwen.encode(short)
    assert threads == []
    ids = await qwen.aencode(long)
    assert ids == qwen.encode(long) and len(ids) > 8000
    assert threads and threads[0] != loop_thread

    # Meanwhile the loop keeps running: a ticker advances while the long encode works.
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await qwen.aencode(long * 4)
    task.cancel()
    assert ticks > 1


def test_a_parsers_markers_are_looked_up_once_per_tokenizer() -> None:
    tokenizer = load_tokenizer(str(FIXTURES / "qwen3"))
    first = tokenizer.special_ids(("<|im_start|>", "<|im_end|>", "not a token"))
    assert first == {151644, 151645}
    assert tokenizer.special_ids(("<|im_start|>", "<|im_end|>", "not a token")) is first  # from memory
    assert tokenizer.single_token_id("</think>") == 151668 and tokenizer.single_token_id("</think>") == 151668
    assert tokenizer.single_token_id("two words") is None and tokenizer.single_token_id("two words") is None
    assert replace(tokenizer, chat_template=None)._facts == {}  # a copy learns its own facts

"""The encode cache: whole prompts (L0) and prefixes cut after a special token (L1) give exactly the
ids a plain encode gives, for every fixture tokenizer, within their byte budgets."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from common import telemetry
from inference.pipeline import encode_cache as encode_cache_module
from inference.pipeline.encode_cache import EncodeCache
from inference.pipeline.templates import render
from inference.pipeline.tokenizers import ModelTokenizer, load_tokenizer
from standins.fixtures import FIXTURE_MODELS as FIXTURES

FAMILIES = {
    "qwen3": None,
    "llama3": "chat_template.llama-3.2.jinja",
    "mistral": None,
    "deepseek-r1": "chat_template.deepseek-r1-distill.jinja",
}
WORDS = ("hello", " world", "日本語", "🦊", "\n", "  ", "code: x = [1, 2]", "Ünïcödé", "tab\there", "end.")


def _tokenizer(name: str) -> ModelTokenizer:
    template = FAMILIES[name]
    return load_tokenizer(FIXTURES / name, chat_template=str(FIXTURES / name / template) if template else None)


def _text(rng: random.Random) -> str:
    return "".join(rng.choices(WORDS, k=rng.randint(1, 12)))


def _conversation(rng: random.Random) -> list[dict]:
    system = {"role": "system", "content": "You are terse. " + "".join(rng.choices(WORDS, k=8))}
    return [system, {"role": "user", "content": _text(rng)}]


def _next_turn(rng: random.Random) -> list[dict]:
    return [{"role": "assistant", "content": _text(rng)}, {"role": "user", "content": _text(rng)}]


def _lookups(layer: str, result: str) -> float:
    return telemetry.REGISTRY.get_sample_value(
        "gw_tokenizer_cache_lookups_total", {"layer": layer, "result": result}
    ) or 0.0


def _cached(cache: EncodeCache, tokenizer: ModelTokenizer, text: str) -> tuple[int, ...]:
    return cache.lookup(tokenizer, text, False) or cache.encode(tokenizer, text, False, tokenizer.encode)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_growing_conversations_match_a_plain_encode(name: str) -> None:
    tokenizer = _tokenizer(name)
    assert tokenizer.chat_template is not None
    cache = EncodeCache(1 << 20, 1 << 20)
    rng = random.Random(name)
    for _ in range(5):
        messages = _conversation(rng)
        for _ in range(8):
            prompt = render(tokenizer.chat_template, messages).text
            assert _cached(cache, tokenizer, prompt) == tuple(tokenizer.encode(prompt))
            messages = messages + _next_turn(rng)


def test_a_longer_conversation_reuses_its_prefix() -> None:
    tokenizer = _tokenizer("qwen3")
    assert tokenizer.chat_template is not None
    cache = EncodeCache(1 << 20, 1 << 20)
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    second = [*first, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More?"}]
    _cached(cache, tokenizer, render(tokenizer.chat_template, first).text)
    hits, reused = _lookups("l1", "hit"), telemetry.REGISTRY.get_sample_value(
        "gw_tokenizer_cache_reused_bytes_total", {"layer": "l1"}
    ) or 0.0
    text = render(tokenizer.chat_template, second).text
    assert _cached(cache, tokenizer, text) == tuple(tokenizer.encode(text))
    assert _lookups("l1", "hit") == hits + 1
    assert (telemetry.REGISTRY.get_sample_value("gw_tokenizer_cache_reused_bytes_total", {"layer": "l1"}) or 0) > reused


def test_the_same_prompt_again_is_an_l0_hit() -> None:
    tokenizer = _tokenizer("llama3")
    cache = EncodeCache(1 << 20, 0)
    misses = _lookups("l0", "miss")
    assert cache.lookup(tokenizer, "Hello there", True) is None
    ids = cache.encode(tokenizer, "Hello there", True, lambda text: tokenizer.encode(text, add_special_tokens=True))
    hits = _lookups("l0", "hit")
    assert cache.lookup(tokenizer, "Hello there", True) == ids == tuple(tokenizer.encode("Hello there", add_special_tokens=True))
    assert cache.lookup(tokenizer, "Hello there", False) is None  # the special-token choice is part of the key
    assert _lookups("l0", "hit") == hits + 1 and _lookups("l0", "miss") == misses + 2


def test_budgets_are_bytes_and_evict_the_oldest() -> None:
    tokenizer = _tokenizer("qwen3")
    cache = EncodeCache(4000, 0)
    evictions = telemetry.REGISTRY.get_sample_value("gw_tokenizer_cache_evictions_total", {"layer": "l0"}) or 0.0
    for index in range(40):
        _cached(cache, tokenizer, f"prompt number {index} " * 5)
    assert cache.l0.bytes <= 4000 and 0 < len(cache.l0) < 40
    assert cache.lookup(tokenizer, "prompt number 0 " * 5, False) is None
    assert cache.lookup(tokenizer, "prompt number 39 " * 5, False) is not None
    assert (telemetry.REGISTRY.get_sample_value("gw_tokenizer_cache_evictions_total", {"layer": "l0"}) or 0) > evictions
    off = EncodeCache(0, 0)
    assert off.lookup(tokenizer, "x", False) is None
    assert off.encode(tokenizer, "x", False, tokenizer.encode) == tuple(tokenizer.encode("x"))
    assert len(off.l0) == len(off.l1) == 0


def test_a_layer_holds_about_what_it_counts() -> None:
    """The byte budget counts what the cached ids really hold (tuple slots and int objects), so a
    full layer stays within about its limit (measured with tracemalloc)."""
    tokenizer = _tokenizer("qwen3")
    texts = [f"request {index}: " + "lorem ipsum dolor sit amet " * 40 for index in range(400)]
    tracemalloc.start()
    try:
        cache = EncodeCache(1 << 20, 0)
        before = tracemalloc.get_traced_memory()[0]
        for text in texts:
            cache.encode(tokenizer, text, False, tokenizer.encode)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.l0.bytes <= 1 << 20 and len(cache.l0) < len(texts)
    assert held < 1.5 * (1 << 20)


def test_prefix_digests_in_one_pass_equal_each_prefix_hashed_alone() -> None:
    text = "<|im_start|>system\nsé 日本 😀<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    ends = [end for end in range(0, len(text) + 1, 7)]
    assert encode_cache_module._prefix_digests(text, ends) == [encode_cache_module._digest(text[:end]) for end in ends]

"""The tiktoken encoder built from a tokenizer.json: used for Qwen3 and Llama 3, refused for other
shapes, and giving the ids ``tokenizers`` gives (golden prompts, long mixed texts, added tokens).
A text that is not NFC, or an encode that adds special tokens, goes to ``tokenizers``."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from tokenizers import Tokenizer

from inference.pipeline import bpe_encoder as bpe_module
from inference.pipeline.bpe_encoder import NATIVE_MIN_CHARS, BpeEncoder, bpe_encoder
from inference.pipeline.tokenizers import (
    OFFLOAD_ENCODE_CHARS,
    OFFLOAD_FAST_ENCODE_CHARS,
    ModelTokenizer,
    load_tokenizer,
)

from .splitting import FIXTURES

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def qwen() -> ModelTokenizer:
    return load_tokenizer(FIXTURES / "qwen3")


@pytest.fixture(scope="module")
def llama() -> ModelTokenizer:
    return load_tokenizer(FIXTURES / "llama3")


def _reference(tokenizer: ModelTokenizer, text: str) -> list[int]:
    return list(tokenizer.tokenizer.encode(text, add_special_tokens=False).ids)


def test_qwen3_and_llama3_get_the_fast_encoder_and_other_shapes_do_not(qwen: ModelTokenizer, llama: ModelTokenizer) -> None:
    assert qwen.fast is not None and qwen.fast.needs_nfc  # Qwen normalises to NFC
    assert llama.fast is not None and not llama.fast.needs_nfc
    assert qwen.offload_chars == OFFLOAD_FAST_ENCODE_CHARS
    for family in ("deepseek-r1", "mistral", "whisper-large-v3"):  # other pre-tokenizers
        other = load_tokenizer(FIXTURES / family)
        assert other.fast is None
        assert other.offload_chars == OFFLOAD_ENCODE_CHARS


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_golden_prompts_encode_to_the_same_ids(family: str, qwen: ModelTokenizer, llama: ModelTokenizer) -> None:
    tokenizer = qwen if family == "qwen3" else llama
    prompts = sorted(GOLDEN.glob(f"{family.rstrip('3')}*.txt"))
    assert prompts, "golden prompts for the family"
    for prompt in prompts:
        text = prompt.read_text(encoding="utf-8")
        assert tokenizer.encode(text) == _reference(tokenizer, text), prompt.name


def _mixed_text(rng: random.Random, added: list[str]) -> str:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    words = readme.split()
    scripts = ["日本語", "中文", "한국어", "Ελληνικά", "русский", "עברית", "😀🎉", "ﬁ", "ǅ", "\u00a0", "\u3000", "١٢٣"]
    parts: list[str] = []
    for _ in range(3000):
        pick = rng.random()
        if pick < 0.7:
            parts.append(rng.choice(words))
        elif pick < 0.85:
            parts.append(rng.choice(scripts))
        elif pick < 0.95:
            parts.append(rng.choice([" ", "  ", "\n", "\n\n", "\t", "\r\n", "   \n "]))
        else:
            parts.append(rng.choice(added))
        parts.append(rng.choice([" ", "", "\n"]))
    return "".join(parts)


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_long_mixed_texts_with_added_tokens_encode_to_the_same_ids(
    family: str, qwen: ModelTokenizer, llama: ModelTokenizer
) -> None:
    tokenizer = qwen if family == "qwen3" else llama
    added = [token.content for token in tokenizer.tokenizer.get_added_tokens_decoder().values()]
    rng = random.Random(7)
    for _ in range(5):
        text = _mixed_text(rng, added)
        assert tokenizer.encode(text) == _reference(tokenizer, text)
        assert tokenizer.encode_released(text) == _reference(tokenizer, text)


def test_a_text_that_is_not_nfc_goes_to_tokenizers(qwen: ModelTokenizer) -> None:
    text = "cafe\u0301 <|im_start|>user\nre\u0301sume\u0301<|im_end|>"  # decomposed accents
    assert qwen.fast is not None and qwen.fast.encode(text) is None
    assert qwen.encode(text) == _reference(qwen, text)  # normalised by tokenizers: the é token


def test_adding_special_tokens_goes_to_tokenizers(llama: ModelTokenizer) -> None:
    ids = llama.encode("hello", add_special_tokens=True)
    assert ids[0] == llama.bos_token_id
    assert ids == list(llama.tokenizer.encode("hello", add_special_tokens=True).ids)


def _qwen_json() -> dict[str, Any]:
    return orjson.loads((FIXTURES / "qwen3" / "tokenizer.json").read_bytes())


@pytest.fixture(scope="module")
def qwen_json() -> dict[str, Any]:
    return _qwen_json()


def _edited(data: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    """``data`` with the value at ``path`` replaced: the containers on the path copied, the rest
    shared (a deep copy of the 150k-entry vocabulary takes seconds)."""
    edited = dict(data)
    target: Any = edited
    for key in path[:-1]:
        child = target[key]
        target[key] = child = list(child) if isinstance(child, list) else dict(child)
        target = child
    target[path[-1]] = value
    return edited


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["normalizer"], {"type": "NFKC"}),
        (["model", "byte_fallback"], True),
        (["model", "dropout"], 0.1),
        (["pre_tokenizer", "pretokenizers", 1, "add_prefix_space"], True),
        (["pre_tokenizer", "pretokenizers", 0, "behavior"], "MergedWithPrevious"),
        (["added_tokens", 0, "lstrip"], True),
        (["model", "vocab", "not-byte-level\u4e00"], 5),
    ],
    ids=["nfkc", "byte-fallback", "dropout", "prefix-space", "merged-split", "lstrip", "not-byte-level"],
)
def test_shapes_tiktoken_does_not_reproduce_are_refused(
    qwen_json: dict[str, Any], qwen: ModelTokenizer, path: list[Any], value: Any
) -> None:
    assert bpe_encoder(_edited(qwen_json, path, value), qwen.tokenizer, name="edited") is None


def test_an_added_token_starting_another_is_refused(qwen_json: dict[str, Any], qwen: ModelTokenizer) -> None:
    first = qwen_json["added_tokens"][0]
    edited = _edited(qwen_json, ["added_tokens"], [*qwen_json["added_tokens"], {**first, "id": 999_999, "content": "<|endoftext|>x"}])
    assert bpe_encoder(edited, qwen.tokenizer, name="edited") is None


def test_a_tokenizer_that_disagrees_on_the_corpus_is_refused(qwen_json: dict[str, Any]) -> None:
    """The check at load: a reference whose words never take the space before them (" world" in
    two pieces) differs from the real pattern on nearly every text of the corpus."""
    split = qwen_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    words = "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    assert words in split
    reference = Tokenizer.from_str(
        orjson.dumps(_edited(qwen_json, ["pre_tokenizer", "pretokenizers", 0, "pattern", "Regex"],
                             split.replace(words, "\\p{L}+"))).decode()
    )
    assert bpe_encoder(qwen_json, reference, name="mismatched") is None
    assert bpe_encoder(qwen_json, Tokenizer.from_str(orjson.dumps(qwen_json).decode()), name="same") is not None


# fastokens (D103): built on a thread on the first long text, used once it agrees with tokenizers.

needs_fastokens = pytest.mark.skipif(bpe_module.fastokens is None, reason="fastokens is not installed")


@needs_fastokens
@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_fastokens_takes_over_after_a_long_text_with_the_same_ids(family: str) -> None:
    fresh = load_tokenizer(FIXTURES / family)  # its own: the module's keep tiktoken until a long text
    fast = fresh.fast
    assert fast is not None and fast.native is None
    short = "Hello <|im_start|> world" if family == "qwen3" else "Hello <|begin_of_text|> world"
    assert fresh.encode(short) == _reference(fresh, short)
    assert not fast._started  # a short text starts nothing
    added = [token.content for token in fresh.tokenizer.get_added_tokens_decoder().values()]
    long_text = _mixed_text(random.Random(11), added)
    assert len(long_text) >= NATIVE_MIN_CHARS
    assert fresh.encode(long_text) == _reference(fresh, long_text)  # tiktoken's, while fastokens loads
    assert fast._started and fast.start_native() is None  # the long text started it, once
    _wait_native(fresh)
    assert fast.native is not None
    rng = random.Random(5)
    for _ in range(3):
        text = _mixed_text(rng, added)
        assert fresh.encode(text) == _reference(fresh, text)
        assert fresh.encode_released(text) == _reference(fresh, text)
    for prompt in sorted(GOLDEN.glob(f"{family.rstrip('3')}*.txt")):
        text = prompt.read_text(encoding="utf-8")
        assert fresh.encode(text) == _reference(fresh, text), prompt.name
    if fast.needs_nfc:
        decomposed = "cafe\u0301 <|im_start|>user\nre\u0301sume\u0301<|im_end|>"
        assert fast.encode(decomposed) is None
        assert fresh.encode(decomposed) == _reference(fresh, decomposed)


def _wait_native(tokenizer: ModelTokenizer, timeout: float = 120.0) -> None:
    """Until the fastokens build started by a long text has finished (used or refused)."""
    deadline = time.monotonic() + timeout
    fast = tokenizer.fast
    assert fast is not None
    while fast.native is None and fast._source is not None and time.monotonic() < deadline:
        time.sleep(0.05)


@needs_fastokens
def test_a_fastokens_that_disagrees_on_the_corpus_is_not_used(qwen_json: dict[str, Any], qwen: ModelTokenizer) -> None:
    """The reference of the corpus check edited (words never take the space before them): fastokens,
    reading the real file, differs from it and tiktoken goes on encoding."""
    split = qwen_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    reference = Tokenizer.from_str(
        orjson.dumps(_edited(qwen_json, ["pre_tokenizer", "pretokenizers", 0, "pattern", "Regex"],
                             split.replace("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", "\\p{L}+"))).decode()
    )
    assert qwen.fast is not None
    encoder = BpeEncoder(qwen.fast.encoding, True, source=FIXTURES / "qwen3" / "tokenizer.json", reference=reference)
    thread = encoder.start_native()
    assert thread is not None
    thread.join(120)
    assert encoder.native is None
    text = "word " * NATIVE_MIN_CHARS
    assert encoder.encode(text) == qwen.fast.encoding.encode(text, allowed_special="all")


@needs_fastokens
def test_a_file_fastokens_cannot_read_leaves_tiktoken(tmp_path: Path, qwen: ModelTokenizer) -> None:
    assert qwen.fast is not None
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    encoder = BpeEncoder(qwen.fast.encoding, True, source=broken, reference=qwen.tokenizer)
    thread = encoder.start_native()
    assert thread is not None
    thread.join(120)
    assert encoder.native is None

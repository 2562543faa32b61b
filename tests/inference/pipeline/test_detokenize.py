"""The incremental detokenizer against ``tokenizer.decode(all_ids)`` with the real fixture
tokenizers: multilingual text and emoji, one token per step and in batches; no step ever sends a
U+FFFD for text that has none, and each step decodes only a small window."""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any, Sequence

import pytest
from tokenizers import Tokenizer

from inference.pipeline.detokenize import IncrementalDetokenizer, TokenBytes

from .splitting import FIXTURES

FOLDERS = ("llama3", "qwen3", "mistral", "deepseek-r1", "whisper-large-v3")
TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Grüße aus Zürich — naïve café, smörgåsbord, 12 °C.",
    "你好，世界！今天天气很好。日本語のテキスト、한국어 텍스트.",
    "مرحبا بالعالم • Привет, мир • Γειά σου Κόσμε • שלום עולם",
    "Emoji: 😀🙂👋🏽 family 👨‍👩‍👧‍👦 flags 🇨🇭🇯🇵 math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 🫠.",
    "  leading spaces,\ttabs,\nnewlines\n\n  and   runs of   spaces  ",
    "def f(x):\n    return {\"a\": [1, 2, 3]}  # code ✓",
)


@lru_cache(maxsize=None)
def tokenizer(folder: str) -> Tokenizer:
    return Tokenizer.from_file(str(FIXTURES / folder / "tokenizer.json"))


def stream(detok: IncrementalDetokenizer, ids: Sequence[int], batch: int) -> list[str]:
    deltas = [detok.step(ids[at : at + batch]) for at in range(0, len(ids), batch)]
    deltas.append(detok.flush())
    return deltas


def token_id_of(tok: Tokenizer, text: str) -> int:
    token_id = tok.token_to_id(text)
    assert token_id is not None, text
    return int(token_id)


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_deltas_concatenate_to_the_full_decode(folder: str, batch: int) -> None:
    tok = tokenizer(folder)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        deltas = stream(IncrementalDetokenizer(tok), ids, batch)
        assert "".join(deltas) == tok.decode(ids), text
        assert not any("\ufffd" in delta for delta in deltas), text


@pytest.mark.parametrize("folder", ["llama3", "qwen3", "mistral", "deepseek-r1"])
def test_a_split_character_is_held_until_its_last_byte(folder: str) -> None:
    tok = tokenizer(folder)
    ids = tok.encode("Emoji 🫠 and 𝔘", add_special_tokens=False).ids
    pieces = [tok.decode([token_id]) for token_id in ids]
    assert any("\ufffd" in piece for piece in pieces), "the text must split a character across tokens"
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.step([token_id]) for token_id in ids]
    assert "" in deltas  # held while incomplete
    assert "".join(deltas) == tok.decode(ids) == "Emoji 🫠 and 𝔘"


def test_mistral_byte_fallback_tokens_are_decoded() -> None:
    tok = tokenizer("mistral")
    encoding = tok.encode("🫠", add_special_tokens=False)
    assert any(token.startswith("<0x") for token in encoding.tokens)
    assert "".join(stream(IncrementalDetokenizer(tok), encoding.ids, 1)) == tok.decode(encoding.ids)


@pytest.mark.parametrize("folder", ["llama3", "qwen3", "mistral", "deepseek-r1"])
def test_a_truncated_character_is_sent_by_flush(folder: str) -> None:
    tok = tokenizer(folder)
    ids = tok.encode("ok 🫠", add_special_tokens=False).ids[:-1]  # cut inside the emoji
    assert tok.decode(ids).endswith("\ufffd")
    detok = IncrementalDetokenizer(tok)
    sent = "".join(detok.step([token_id]) for token_id in ids)
    assert "\ufffd" not in sent
    assert sent + detok.flush() == tok.decode(ids)
    assert detok.flush() == ""


@pytest.mark.parametrize(
    ("folder", "special"),
    [("qwen3", "<|im_end|>"), ("llama3", "<|eot_id|>"), ("mistral", "[TOOL_CALLS]"), ("deepseek-r1", "<｜end▁of▁sentence｜>")],
)
@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(folder: str, special: str, skip: bool) -> None:
    tok = tokenizer(folder)
    special_id = token_id_of(tok, special)
    ids = [*tok.encode("Answer: 42 ✓", add_special_tokens=False).ids, special_id, *tok.encode(" more", add_special_tokens=False).ids]
    text = "".join(stream(IncrementalDetokenizer(tok, skip_special_tokens=skip), ids, 1))
    assert text == tok.decode(ids, skip_special_tokens=skip)
    assert (special in text) is (not skip)


@pytest.mark.parametrize(
    ("folder", "kept", "skipped"),
    [("mistral", "[TOOL_CALLS]", "</s>"), ("llama3", "<|python_tag|>", "<|eot_id|>")],
)
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_skipping_narrowed_to_a_set_decodes_the_kept_special_tokens(folder: str, kept: str, skipped: str, batch: int) -> None:
    """A parser's marker kept, every other special token (the end of sequence) still skipped, in
    the prompt context too: the text is the decode of the ids without the skipped ones."""
    tok = tokenizer(folder)
    specials = frozenset(i for i, added in tok.get_added_tokens_decoder().items() if added.special)
    kept_id, skipped_id = (token_id_of(tok, text) for text in (kept, skipped))
    assert kept_id in specials and skipped_id in specials
    ids = [kept_id, *tok.encode(' [{"name": "f"}] ✓', add_special_tokens=False).ids, skipped_id, kept_id, skipped_id]
    whole = tok.decode([i for i in ids if i != skipped_id], skip_special_tokens=False)
    assert whole.count(kept) == 2 and skipped not in whole
    detok = IncrementalDetokenizer(tok, skipped_ids=specials - {kept_id})
    assert "".join(stream(detok, ids, batch)) == whole
    prompt = [*tok.encode("Hi there", add_special_tokens=False).ids, skipped_id]
    primed = IncrementalDetokenizer(tok, prompt_ids=prompt, skipped_ids=specials - {kept_id})
    assert "".join(stream(primed, ids, batch)).lstrip() == whole.lstrip()


def test_prompt_context_keeps_the_space_a_sentencepiece_token_carries() -> None:
    tok = tokenizer("mistral")
    prompt = tok.encode("<s>[INST] Hi[/INST]", add_special_tokens=False).ids
    output = tok.encode("Hello there", add_special_tokens=False).ids  # "▁Hello", "▁there"
    unprimed = "".join(stream(IncrementalDetokenizer(tok), output, 1))
    primed = "".join(stream(IncrementalDetokenizer(tok, prompt_ids=prompt), output, 1))
    assert unprimed == "Hello there" == tok.decode(output)
    assert primed == " Hello there"


@pytest.mark.parametrize("folder", ["llama3", "qwen3"])
def test_prompt_context_changes_nothing_for_byte_level_tokenizers(folder: str) -> None:
    tok = tokenizer(folder)
    prompt = tok.encode("User: 你好 🫠\nAssistant:", add_special_tokens=False).ids
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        primed = "".join(stream(IncrementalDetokenizer(tok, prompt_ids=prompt), ids, 1))
        assert primed == tok.decode(ids)


class CountingTokenizer:
    """Records the length of every decode the detokenizer asks for."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.windows: list[int] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> Any:
        self.windows.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_each_step_decodes_a_small_window() -> None:
    counting = CountingTokenizer(tokenizer("qwen3"))
    ids = counting.inner.encode(" ".join(TEXTS) * 20, add_special_tokens=False).ids
    assert len(ids) > 2000
    detok = IncrementalDetokenizer(counting, prompt_ids=ids[:50])  # type: ignore[arg-type]
    text = "".join(stream(detok, ids, 1))
    assert text == counting.inner.decode(ids)
    assert max(counting.windows) <= 24
    assert len(counting.windows) <= 2 * len(ids) + 30


@pytest.mark.parametrize("folder", ["qwen3", "llama3", "deepseek-r1", "whisper-large-v3"])
def test_steps_read_from_token_bytes_give_the_decoded_deltas(folder: str) -> None:
    """A byte-level tokenizer's steps read from its TokenBytes (no decode) give exactly the deltas of
    the decoding path: random ids (special, split characters, emoji), real text, prompts, skipping
    on, off and narrowed, batches of 1 to 3."""
    tok = tokenizer(folder)
    specials = frozenset(i for i, added in tok.get_added_tokens_decoder().items() if added.special)
    table = TokenBytes(tok, specials)
    size = tok.get_vocab_size(with_added_tokens=True)
    real = tok.encode(" ".join(TEXTS), add_special_tokens=False).ids
    rng = random.Random(99)
    for trial in range(300):
        if trial % 3 == 0:
            ids = [rng.randrange(size) for _ in range(rng.randint(1, 40))]
        elif trial % 3 == 1:
            ids = list(real[: rng.randint(1, len(real))])
        else:
            ids = [rng.choice(real) if rng.random() < 0.7 else rng.randrange(size) for _ in range(rng.randint(1, 60))]
        prompt = [rng.randrange(size) for _ in range(rng.randint(0, 8))]
        for skip, narrowed in ((True, None), (False, None), (True, frozenset(sorted(specials)[:3]))):
            batch = rng.randint(1, 3)
            decoded, read = (
                stream(IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_ids=prompt, skipped_ids=narrowed,
                                              concatenative=True, token_bytes=bytes_of), ids, batch)
                for bytes_of in (None, table)
            )  # fmt: skip
            assert read == decoded, (ids, prompt, skip, narrowed, batch)


@pytest.mark.parametrize("folder", ["qwen3", "llama3", "mistral"])
def test_step_one_gives_the_deltas_of_step(folder: str) -> None:
    """step_one (one id, D106) against step of the same id: random ids (special, split characters),
    real text long enough to trim the window, prompts, skipping on, off and narrowed, with and
    without token bytes, step and step_one mixed."""
    tok = tokenizer(folder)
    specials = frozenset(i for i, added in tok.get_added_tokens_decoder().items() if added.special)
    table = TokenBytes(tok, specials)
    size = tok.get_vocab_size(with_added_tokens=True)
    real = tok.encode(" ".join(TEXTS) * 12, add_special_tokens=False).ids
    rng = random.Random(7)
    for trial in range(60):
        if trial % 3 == 0:
            ids = [rng.randrange(size) for _ in range(rng.randint(1, 40))]
        elif trial % 3 == 1:
            ids = list(real[: rng.randint(1, len(real))])
        else:
            ids = [rng.choice(real) if rng.random() < 0.7 else rng.randrange(size) for _ in range(rng.randint(1, 60))]
        prompt = [rng.randrange(size) for _ in range(rng.randint(0, 8))]
        for skip, narrowed in ((True, None), (False, None), (True, frozenset(sorted(specials)[:3]))):
            for bytes_of in (None, table):
                made = [
                    IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_ids=prompt, skipped_ids=narrowed,
                                           concatenative=bytes_of is not None, token_bytes=bytes_of)
                    for _ in range(2)
                ]  # fmt: skip
                by_step = [made[0].step((token_id,)) for token_id in ids]
                by_one = [made[1].step_one(token_id) if rng.random() < 0.8 else made[1].step((token_id,)) for token_id in ids]
                assert by_one == by_step and made[1].flush() == made[0].flush(), (ids, prompt, skip, narrowed)
                assert made[1].sent_characters == made[0].sent_characters

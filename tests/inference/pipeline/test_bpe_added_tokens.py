"""The tiktoken encoder's text cut at its added tokens (inference/pipeline/bpe_encoder.py, D114):
the ordinary text between them through ``encode_ordinary`` and each added token its id give what
tiktoken's ``encode(text, allowed_special="all")`` gives, added tokens side by side, at either end,
lone and paired surrogates included."""

from __future__ import annotations

import random

import pytest

from inference.pipeline.tokenizers import load_tokenizer

from .splitting import FIXTURES


@pytest.mark.parametrize("model", ["qwen3", "llama3"])
def test_the_text_cut_at_added_tokens_encodes_as_tiktoken_does(model: str) -> None:
    encoder = load_tokenizer(FIXTURES / model).fast
    assert encoder is not None
    added = sorted(encoder.encoding.special_tokens_set)
    rng = random.Random(27)
    alphabet = "ab <|>\n\t  日本語 x😀\ud800\udc00'"
    texts = ["", "plain text only", added[0], added[0] + added[-1], f"{added[0]}x{added[1]}"]
    for _ in range(500):
        parts: list[str] = []
        for _ in range(rng.randint(0, 6)):
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10))))
            if rng.random() < 0.6:
                parts.append(rng.choice(added))
        texts.append("".join(parts))
    for text in texts:
        assert encoder._encode_all(text) == encoder.encoding.encode(text, allowed_special="all"), text

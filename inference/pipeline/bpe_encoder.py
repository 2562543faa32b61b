"""A faster encoder for byte-level BPE tokenizers: tiktoken, built from the same tokenizer.json.

The ``tokenizers`` binding spends about 1.5 µs per token encoding a prompt (an 8k-token Qwen3
prompt: 12 ms of the request's CPU). Qwen and Llama 3 vocabularies are tiktoken vocabularies at
heart (byte-level BPE ranked by token id, pieces split by one regex), and tiktoken encodes them
about ten times faster. So a tokenizer.json of exactly that shape gets a :class:`BpeEncoder` for
the pipeline's hot encode (rendered prompts, ``add_special_tokens=False``), and everything else
stays with ``tokenizers``: decoding, post-processors, any other shape.

The shape accepted, and nothing else (:func:`bpe_encoder` returns None and says why otherwise):

* model BPE without dropout, byte fallback, unknown token or sub-word affixes;
* normalizer none or NFC (a text that is not already NFC is left to ``tokenizers``, so the
  normalisation is never needed here);
* pre-tokenizer ``Sequence[Split(regex, Isolated), ByteLevel(use_regex=false,
  add_prefix_space=false)]``: the regex is tiktoken's piece pattern;
* every vocabulary entry in the byte-level alphabet; added tokens without strip or single-word
  rules, none the start of another (tiktoken tries them in no fixed order).

Then the two must agree on a sample corpus (prose, code, whitespace runs, digits, contractions in
either case, several scripts, emoji, every added token between texts); one difference and the
encoder is not used. Both are deterministic, so a tokenizer that passes gets the same ids from
either on the texts checked; on the two families shipped as fixtures the ids agree everywhere
tried (tests/inference/pipeline/test_bpe_encoder.py).

A faster encoder still, when the ``fastokens`` package is installed: its ``Tokenizer`` reads the
same tokenizer.json and encodes an 8k-token Qwen3 prompt in about a tenth of tiktoken's time (D103).
Loading it costs about 1.5 s of CPU, so it is built on a thread of its own the first time a text of
:data:`NATIVE_MIN_CHARS` or more is encoded; until it is ready, and for good if it cannot be
loaded or differs from ``tokenizers`` on the same corpus, tiktoken encodes.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import tiktoken
from tokenizers import Tokenizer

try:
    import fastokens  # type: ignore[import-untyped]  # ships no stubs
except ImportError:  # optional: tiktoken alone then
    fastokens = None

__all__ = ["NATIVE_MIN_CHARS", "BpeEncoder", "bpe_encoder", "byte_of_char"]

logger = logging.getLogger(__name__)

NATIVE_MIN_CHARS = 4096
"""The first text at least this long starts building the ``fastokens`` encoder (short prompts
alone never pay its load)."""


class _Unsupported(Exception):
    """The tokenizer.json has a shape the encoder does not reproduce."""


@lru_cache(maxsize=1)
def byte_of_char() -> dict[str, int]:
    """The byte-level alphabet reversed: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + shifted
            shifted += 1
    return {chr(char): byte for byte, char in chars.items()}


class BpeEncoder:
    """tiktoken (or ``fastokens``, once built and checked) in place of ``tokenizers`` for encoding
    texts without added special tokens."""

    __slots__ = (
        "encoding", "needs_nfc", "native", "_source", "_reference", "_added", "_lock", "_started", "_split",
        "_added_ids", "_ordinary",
    )  # fmt: skip

    def __init__(
        self, encoding: tiktoken.Encoding, needs_nfc: bool, *, source: Path | None = None,
        reference: Tokenizer | None = None, added: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.encoding = encoding
        self.needs_nfc = needs_nfc
        self.native: Any = None  # a fastokens.Tokenizer that agreed with ``tokenizers``
        self._source = source if fastokens is not None and reference is not None else None
        self._reference = reference
        self._added = tuple(added)
        self._lock = threading.Lock()
        self._started = False
        # The text cut at its added tokens (captured: every odd piece is one), as tiktoken's encode
        # with allowed_special="all" finds them (leftmost; none starts another, _added_tokens).
        specials = sorted(encoding.special_tokens_set, key=len, reverse=True)
        self._split = re.compile("(%s)" % "|".join(map(re.escape, specials))).split if specials else None
        self._added_ids: dict[str, int] = dict(encoding._special_tokens)  # the ids encode gives them
        self._ordinary = encoding.encode_ordinary

    def encode(self, text: str) -> list[int] | None:
        """The ids of ``text``, added tokens matched; None when ``text`` must go to ``tokenizers``
        (it is not NFC and the tokenizer normalises)."""
        if self.needs_nfc and not unicodedata.is_normalized("NFC", text):
            return None
        native = self.native
        if native is not None:
            return native.encode(text, add_special_tokens=False).ids
        if len(text) >= NATIVE_MIN_CHARS and self._source is not None and not self._started:
            self.start_native()
        return self._encode_all(text)

    def _encode_all(self, text: str) -> list[int]:
        """``self.encoding.encode(text, allowed_special="all")``: the text between added tokens
        through tiktoken's ``encode_ordinary``, each added token its id. tiktoken's ``encode`` turns
        its set of every added token into a Rust one on every call (hashing each token): ~40k
        instructions, more than a short piece's encoding (D114)."""
        split = self._split
        if split is None:
            return self._ordinary(text)
        pieces = split(text)
        ordinary = self._ordinary
        if len(pieces) == 1:
            return ordinary(text)
        added = self._added_ids
        ids: list[int] = ordinary(pieces[0]) if pieces[0] else []
        for token, piece in zip(pieces[1::2], pieces[2::2]):
            ids.append(added[token])
            if piece:
                ids += ordinary(piece)
        return ids

    def start_native(self) -> threading.Thread | None:
        """Start building the ``fastokens`` encoder on a thread (once); the thread, or None when
        there is nothing to build or it was started before."""
        with self._lock:
            if self._started or self._source is None:
                return None
            self._started = True
        thread = threading.Thread(target=self._build_native, name="fastokens-load", daemon=True)
        thread.start()
        return thread

    def _build_native(self) -> None:
        source, reference = self._source, self._reference
        assert source is not None and reference is not None and fastokens is not None
        try:
            native = fastokens.Tokenizer.from_file(str(source))
            for text in _corpus(self._added):
                if native.encode(text, add_special_tokens=False).ids != reference.encode(text, add_special_tokens=False).ids:
                    logger.info("tokenizer %s stays with tiktoken (fastokens differs on %r)", source, text[:40])
                    return
        except Exception as error:  # the library raises its own errors for files it cannot read
            logger.info("tokenizer %s stays with tiktoken (fastokens cannot load it: %s)", source, error)
            return
        finally:
            self._source = self._reference = None
        self.native = native
        logger.info("tokenizer %s encodes with fastokens (checked against tokenizers)", source)


def _piece_pattern(pre_tokenizer: Any) -> str:
    if not isinstance(pre_tokenizer, Mapping) or pre_tokenizer.get("type") != "Sequence":
        raise _Unsupported("the pre-tokenizer is not a Split then ByteLevel sequence")
    steps = pre_tokenizer.get("pretokenizers")
    if not isinstance(steps, list) or len(steps) != 2:
        raise _Unsupported("the pre-tokenizer is not a Split then ByteLevel sequence")
    split, byte_level = steps
    pattern = split.get("pattern") if isinstance(split, Mapping) else None
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or not isinstance(pattern, Mapping)
        or not isinstance(pattern.get("Regex"), str)
    ):
        raise _Unsupported("the split is not an isolating regex")
    if (
        not isinstance(byte_level, Mapping)
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex")
        or byte_level.get("add_prefix_space")
    ):
        raise _Unsupported("the second step is not a plain ByteLevel")
    return str(pattern["Regex"])


def _needs_nfc(normalizer: Any) -> bool:
    if normalizer is None:
        return False
    if isinstance(normalizer, Mapping):
        kind = normalizer.get("type")
        if kind == "NFC":
            return True
        if kind == "Sequence" and normalizer.get("normalizers") == []:
            return False
    raise _Unsupported("the normalizer is neither none nor NFC")


def _ranks(model: Any) -> dict[bytes, int]:
    if not isinstance(model, Mapping) or model.get("type") != "BPE":
        raise _Unsupported("the model is not BPE")
    if model.get("dropout") or model.get("byte_fallback") or model.get("unk_token"):
        raise _Unsupported("the BPE model uses dropout, byte fallback or an unknown token")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise _Unsupported("the BPE model uses sub-word affixes")
    vocab = model.get("vocab")
    if not isinstance(vocab, Mapping):
        raise _Unsupported("the BPE model has no vocabulary")
    alphabet = byte_of_char()
    try:
        return {bytes(alphabet[char] for char in token): int(rank) for token, rank in vocab.items()}
    except KeyError:
        raise _Unsupported("the vocabulary is not byte-level") from None


def _added_tokens(added: Any) -> dict[str, int]:
    tokens: dict[str, int] = {}
    for token in added if isinstance(added, list) else []:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            raise _Unsupported(f"added token {token.get('content')!r} has strip or single-word rules")
        tokens[str(token["content"])] = int(token["id"])
    ordered = sorted(tokens)
    for shorter, longer in zip(ordered, ordered[1:]):
        if longer.startswith(shorter):
            raise _Unsupported(f"added token {shorter!r} starts {longer!r}")
    return tokens


_SAMPLES = (
    "Hello, world! How's it going? I'M FINE, THEY'LL SEE, we'd've gone.",
    "def f(x):\n\treturn x ** 2  # square\n\n\n    indented   \r\n\r\nend",
    "Numbers: 1234567890, 3.14159, -42, 1e-9, 2026-11-24T13:12:05Z, $1,000,000.00",
    "   leading spaces and trailing   \n  \n\t\t\n",
    "中文文本测试，包含标点。日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "العربية نص، עברית טקסט, русский текст, Ελληνικά, हिन्दी पाठ",
    "emoji 👩‍👩‍👧‍👦 🇺🇳 ✨🔥 and symbols ©®™ ∑∫√ ≠ ≤ ≥ → ⇒",
    "café naïve résumé Ångström façade coöperate",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "<tag attr='v'>x</tag> [link](https://example.com/a?b=c&d=e#f) `code` **bold**",
)


def _corpus(added: Sequence[str]) -> list[str]:
    texts = list(_SAMPLES)
    rng = random.Random(20261124)
    pool = "".join(_SAMPLES) + " \n\t\r'0123456789"
    texts.extend("".join(rng.choice(pool) for _ in range(rng.randint(1, 200))) for _ in range(200))
    for index, token in enumerate(added):
        texts.append(f"{_SAMPLES[index % len(_SAMPLES)]}{token}\n{_SAMPLES[(index + 1) % len(_SAMPLES)]} {token}x")
    return [unicodedata.normalize("NFC", text) for text in texts]


def _build(data: Mapping[str, Any], reference: Tokenizer, source: Path | None) -> BpeEncoder:
    needs_nfc = _needs_nfc(data.get("normalizer"))
    pattern = _piece_pattern(data.get("pre_tokenizer"))
    ranks = _ranks(data.get("model"))
    added = _added_tokens(data.get("added_tokens"))
    try:
        encoding = tiktoken.Encoding("gateway-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)
    except Exception as error:  # tiktoken raises plain exceptions for patterns it cannot compile
        raise _Unsupported(f"tiktoken refuses it: {error}") from None
    encoder = BpeEncoder(encoding, needs_nfc, source=source, reference=reference, added=list(added))
    for text in _corpus(list(added)):
        expected = reference.encode(text, add_special_tokens=False).ids
        if encoder.encode(text) != expected:
            raise _Unsupported(f"the ids differ on {text[:40]!r}")
    return encoder


def bpe_encoder(
    data: Mapping[str, Any], reference: Tokenizer, *, name: str, source: Path | None = None
) -> BpeEncoder | None:
    """The fast encoder for the tokenizer.json ``data`` (loaded as ``reference``), or None when its
    shape is not one tiktoken reproduces or the two disagree on the sample corpus. ``source``, the
    file ``data`` was read from, lets it move on to ``fastokens`` (built on first long text)."""
    try:
        encoder = _build(data, reference, source)
    except _Unsupported as reason:
        logger.info("tokenizer %s encodes with tokenizers (%s)", name, reason)
        return None
    logger.info("tokenizer %s encodes with tiktoken (checked against tokenizers)", name)
    return encoder

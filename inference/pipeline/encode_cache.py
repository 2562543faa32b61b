"""Stage "tokenize", cached: prompts the gateway encoded before are not encoded again.

Two layers, each bounded in bytes (the flags ``--tokenizer-cache-l0-max-bytes`` and
``--tokenizer-cache-l1-max-bytes``; 0 turns a layer off), least recently used dropped first:

- **L0**, whole prompts: the same text (same tokenizer, same special-token choice) gets the ids it
  got before; keyed by a digest of the text, so a layer holds ids, not prompts.
- **L1**, prompt prefixes that end right after a special token (a chat template's turn markers,
  ``<|im_end|>``, ``<|eot_id|>``): a prompt that begins with a cached prefix (a conversation's
  earlier turns, a shared system prompt) encodes only the rest. Sound because a tokenizer splits its
  special tokens out before anything else, so the text after one is encoded on its own; a tokenizer
  for which that does not hold (checked once per tokenizer on sample texts) gets no L1. Only for
  prompts encoded without added special tokens (rendered chat prompts), whose ids are the prefix's
  followed by the rest's.

Counted in gw_tokenizer_cache_lookups_total{layer, result}, gw_tokenizer_cache_evictions_total
{layer} and gw_tokenizer_cache_reused_bytes_total{layer} (UTF-8 bytes of prompt text not encoded
again).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import Callable, Sequence

from common import telemetry
from common.config import current_config
from inference.pipeline.tokenizers import ModelTokenizer

__all__ = ["EncodeCache", "Ids", "encode_cache", "reset_encode_cache"]

Ids = tuple[int, ...]
_ID_BYTES = 36  # what one cached id holds: its tuple slot (8) and its int object (28; ids past 256 are not shared)
_ENTRY_BYTES = 120  # a cache entry's own overhead, about
_KEPT_LAST = 3  # prefixes cached per prompt: the first boundary and this many last ones
_L1_SAMPLES = ("Hello", " world", "\nnext line", "  two spaces", "x", "日本語")


class _Layer:
    """One bounded LRU map, in bytes."""

    def __init__(self, name: str, max_bytes: int) -> None:
        self.name = name
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[object, tuple[Ids, int]] = OrderedDict()

    def get(self, key: object) -> Ids | None:
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: object, ids: Ids, cost: int) -> None:
        if cost > self.max_bytes or key in self._entries:
            return
        self._entries[key] = (ids, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            telemetry.record_tokenizer_cache_eviction(self.name)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _digest(text: str) -> bytes:
    return hashlib.blake2b(_utf8(text), digest_size=16).digest()


def _prefix_digests(text: str, ends: Sequence[int]) -> list[bytes]:
    """``_digest(text[:end])`` for each of the ascending ``ends``, in one pass over the text."""
    hasher = hashlib.blake2b(digest_size=16)
    digests: list[bytes] = []
    position = 0
    for end in ends:
        hasher.update(_utf8(text[position:end]))
        digests.append(hasher.copy().digest())
        position = end
    return digests


class _Boundaries:
    """Where a tokenizer's prompts may be cut: right after one of its special tokens."""

    def __init__(self, tokenizer: ModelTokenizer) -> None:
        decoder = tokenizer.tokenizer.get_added_tokens_decoder()
        tokens = sorted(
            {
                token.content
                for token in decoder.values()
                if token.special and token.content and not token.lstrip and not token.rstrip and not token.normalized
            },
            key=len,
            reverse=True,
        )
        self.pattern = re.compile("|".join(re.escape(token) for token in tokens)) if tokens else None
        self.sound = self.pattern is not None and self._splits_cleanly(tokenizer, tokens[0])

    @staticmethod
    def _splits_cleanly(tokenizer: ModelTokenizer, special: str) -> bool:
        """Whether encode(A + special + B) == encode(A + special) + encode(B) on sample texts."""
        for before in _L1_SAMPLES[:3]:
            for after in _L1_SAMPLES:
                head = before + special
                whole = tokenizer.encode(head + after)
                if whole != tokenizer.encode(head) + tokenizer.encode(after):
                    return False
        return True

    def ends(self, text: str) -> list[int]:
        """Character offsets right after each special token in ``text``, in order."""
        assert self.pattern is not None
        return [match.end() for match in self.pattern.finditer(text)]


class EncodeCache:
    """This process's cached encodes, for every tokenizer (keys carry the tokenizer's path)."""

    def __init__(self, l0_max_bytes: int, l1_max_bytes: int) -> None:
        self.l0 = _Layer("l0", l0_max_bytes)
        self.l1 = _Layer("l1", l1_max_bytes)
        self._boundaries: dict[str, _Boundaries] = {}
        self._lock = threading.Lock()  # encodes of long prompts run on worker threads
        self._last: tuple[str, bytes] = ("", _digest(""))  # the text looked up last, and its digest

    def clear(self) -> None:
        with self._lock:
            self.l0.clear()
            self.l1.clear()

    def _boundaries_of(self, tokenizer: ModelTokenizer) -> _Boundaries:
        found = self._boundaries.get(tokenizer.path)
        if found is None:
            found = self._boundaries[tokenizer.path] = _Boundaries(tokenizer)
        return found

    def lookup(self, tokenizer: ModelTokenizer, text: str, add_special_tokens: bool) -> Ids | None:
        """The ids of a prompt seen before (L0), or None."""
        if not self.l0.max_bytes:
            return None
        digest = _digest(text)
        self._last = (text, digest)  # encode() of the same text, on a miss, needs it again
        key = (tokenizer.path, add_special_tokens, digest)
        with self._lock:
            found = self.l0.get(key)
        telemetry.record_tokenizer_cache_lookup("l0", found is not None, len(text.encode("utf-8")) if found else 0)
        return found

    def encode(
        self, tokenizer: ModelTokenizer, text: str, add_special_tokens: bool,
        encode: Callable[[str], Sequence[int]],
    ) -> Ids:  # fmt: skip
        """Encode ``text`` with ``encode`` (``tokenizer``'s, with the same special-token choice),
        using and filling L1, and remember the result in L0. May run on a worker thread."""
        ids = self._encode_with_prefixes(tokenizer, text, add_special_tokens, encode)
        if self.l0.max_bytes:
            last_text, last_digest = self._last
            digest = last_digest if last_text is text else _digest(text)
            with self._lock:
                self.l0.put((tokenizer.path, add_special_tokens, digest), ids, _ID_BYTES * len(ids) + _ENTRY_BYTES)
        return ids

    def _encode_with_prefixes(
        self, tokenizer: ModelTokenizer, text: str, add_special_tokens: bool,
        encode: Callable[[str], Sequence[int]],
    ) -> Ids:  # fmt: skip
        if add_special_tokens or not self.l1.max_bytes:
            return tuple(encode(text))
        boundaries = self._boundaries_of(tokenizer)
        if not boundaries.sound:
            return tuple(encode(text))
        ends = [end for end in boundaries.ends(text) if end < len(text)]
        if not ends:
            return tuple(encode(text))
        path = tokenizer.path
        keys = {end: (path, end, digest) for end, digest in zip(ends, _prefix_digests(text, ends))}
        ids: list[int] = []
        start = 0
        with self._lock:
            for end in reversed(ends):
                found = self.l1.get(keys[end])
                if found is not None:
                    ids, start = list(found), end
                    break
        telemetry.record_tokenizer_cache_lookup("l1", start > 0, len(text[:start].encode("utf-8")) if start else 0)
        # The text past the cached prefix is encoded in pieces cut at the boundaries worth keeping
        # (the first: a shared system prompt; the last few: the conversation so far), which gives
        # the ids of each of those prefixes as well.
        later = [end for end in ends if end > start]
        kept = set(later[:1] + later[-_KEPT_LAST:])
        remembered: list[tuple[tuple[str, int, bytes], int]] = []
        position = start
        for end in later:
            if end in kept:
                ids.extend(encode(text[position:end]))
                remembered.append((keys[end], len(ids)))
                position = end
        ids.extend(encode(text[position:]))
        result = tuple(ids)
        with self._lock:
            for key, count in remembered:
                self.l1.put(key, result[:count], _ID_BYTES * count + _ENTRY_BYTES)
        return result


_cache: EncodeCache | None = None


def encode_cache() -> EncodeCache:
    """This process's cache, sized by the flags on first use."""
    global _cache
    if _cache is None:
        config = current_config()
        _cache = EncodeCache(config.tokenizer_cache_l0_max_bytes, config.tokenizer_cache_l1_max_bytes)
    return _cache


def reset_encode_cache() -> None:
    """Forget the cache (a new config, tests)."""
    global _cache
    _cache = None

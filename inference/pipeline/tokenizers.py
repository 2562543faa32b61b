"""The tokenize stage, and the tokenizers it uses: loaded from a local path, kept in a bounded cache.

A model's tokenizer is ``tokenizer.json`` (the ``tokenizers`` library) with its
``tokenizer_config.json`` (special tokens, the chat template) and, when present,
``generation_config.json`` (more end-of-sequence ids). The chat template comes from, first to last:
the ``--chat-template`` override (a file, or the template text itself), ``chat_template.jinja``,
``chat_template.json``, the ``chat_template`` of tokenizer_config.json.

A rendered chat prompt is encoded with ``add_special_tokens=False``: the templates write the BOS
themselves (Llama 3, Mistral, DeepSeek), and the tokenizers' post-processors would add a second
one. A long prompt is encoded off the event loop (:meth:`ModelTokenizer.aencode`): an 8k-token
prompt takes about 10 ms to encode, which would stall every other request on the loop.

The registry (spec 3, /v1/tokenizers) and the lazy loading on the request path build on
:class:`TokenizerCache` and :func:`load_tokenizer`.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import orjson
from tokenizers import Tokenizer

from inference.pipeline.bpe_encoder import BpeEncoder, bpe_encoder
from inference.pipeline.detokenize import IncrementalDetokenizer, TokenBytes
from inference.pipeline.templates import ChatTemplate, TemplateCompileError

__all__ = [
    "OFFLOAD_ENCODE_CHARS", "OFFLOAD_FAST_ENCODE_CHARS", "ModelTokenizer", "TokenizerCache", "TokenizerLoadError", "load_tokenizer",
    "read_chat_template", "off_loop",
]  # fmt: skip

T = TypeVar("T")

OFFLOAD_ENCODE_CHARS = 4096
"""Texts at least this long are encoded on a worker thread (about 1 ms of encoding and up)."""

OFFLOAD_FAST_ENCODE_CHARS = 32768
"""The same for a tokenizer with a :class:`BpeEncoder` (about eight times faster)."""

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class TokenizerLoadError(Exception):
    """The path holds no usable tokenizer (missing or unreadable files, a bad chat template)."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as error:
        raise TokenizerLoadError(f"cannot read {path}: {error}") from error
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path} is not a JSON object")
    return data


def read_chat_template(
    directory: Path, config: Mapping[str, Any], override: str | None = None
) -> str | list[dict[str, str]] | None:
    """The chat template source by precedence (override, chat_template.jinja, chat_template.json,
    tokenizer_config.json); None when the model has none."""
    if override:
        candidate = Path(override).expanduser()
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
        if "{{" in override or "{%" in override:
            return override  # the template text itself
        raise TokenizerLoadError(f"chat template {override!r} is neither a file nor a template")
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = directory / "chat_template.json"
    if json_file.is_file():
        value = _read_json(json_file).get("chat_template")
        if isinstance(value, (str, list)):
            return value
    value = config.get("chat_template")
    if isinstance(value, (str, list)):
        return value
    return None


@lru_cache(maxsize=1)
def _encode_executor() -> ThreadPoolExecutor:
    """Threads for long encodes: ``encode_batch`` releases the GIL while it works."""
    return ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2)), thread_name_prefix="encode")


async def off_loop(work: Callable[[], T]) -> T:
    """Run ``work`` (a long encode) on the encode threads, not the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_encode_executor(), work)


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    """One model's tokenizer, special tokens and chat template. Immutable; shared by requests."""

    path: str
    tokenizer: Tokenizer
    config: Mapping[str, Any] = field(default_factory=dict)
    chat_template: ChatTemplate | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    special_token_ids: frozenset[int] = frozenset()
    fast: BpeEncoder | None = None
    """tiktoken for texts without added special tokens, when it reproduces this tokenizer."""
    # Facts of this tokenizer a request asks for again and again (a parser's markers as ids): looked
    # up once, then read from here on the request path.
    _facts: dict[tuple[str, tuple[str, ...]], Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def offload_chars(self) -> int:
        """Texts at least this long are encoded on a worker thread, not the event loop."""
        return OFFLOAD_FAST_ENCODE_CHARS if self.fast is not None else OFFLOAD_ENCODE_CHARS

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. A rendered chat prompt: leave ``add_special_tokens`` False."""
        if self.fast is not None and not add_special_tokens:
            ids = self.fast.encode(text)
            if ids is not None:
                return ids
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_released(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """:meth:`encode` releasing the GIL while it works (for worker threads; tiktoken releases
        it too)."""
        if self.fast is not None and not add_special_tokens:
            ids = self.fast.encode(text)
            if ids is not None:
                return ids
        (encoding,) = self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    async def aencode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """:meth:`encode` that never holds the event loop for long: texts of
        :attr:`offload_chars` characters and more run on a worker thread."""
        if len(text) < self.offload_chars:
            return self.encode(text, add_special_tokens=add_special_tokens)
        return await off_loop(partial(self.encode_released, text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        """One token as text, special tokens included (logprobs name tokens this way)."""
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False))

    def detokenizer(
        self, *, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = (),
        kept_special_ids: frozenset[int] = frozenset(),
    ) -> IncrementalDetokenizer:  # fmt: skip
        """A fresh incremental detokenizer for one choice. ``kept_special_ids``: special tokens
        decoded as text even with ``skip_special_tokens`` (a parser's markers, :meth:`special_ids`)."""
        skipped = self.special_token_ids - kept_special_ids if skip_special_tokens and kept_special_ids else None
        concatenative = self.concatenative_decode
        return IncrementalDetokenizer(
            self.tokenizer, skip_special_tokens=skip_special_tokens, prompt_ids=prompt_ids, skipped_ids=skipped,
            concatenative=concatenative, token_bytes=self.token_bytes if concatenative else None,
        )  # fmt: skip

    @property
    def token_bytes(self) -> TokenBytes:
        """The bytes of this tokenizer's ordinary token ids, for a byte-level BPE decoder's steps
        (:class:`~inference.pipeline.detokenize.TokenBytes`; one per tokenizer, filled as ids are met)."""
        key = ("token_bytes", ())
        known: TokenBytes | None = self._facts.get(key)
        if known is None:
            known = self._facts[key] = TokenBytes(self.tokenizer, self.special_token_ids)
        return known

    @property
    def concatenative_decode(self) -> bool:
        """Whether the decoder is byte-level BPE's alone: the text of ids is their tokens' bytes joined
        and read as UTF-8, so ids that begin and end on character boundaries decode to the texts of
        their parts joined (the incremental detokenizer then decodes once per step, not twice)."""
        key = ("concatenative_decode", ())
        known: bool | None = self._facts.get(key)
        if known is None:
            known = self._facts[key] = type(self.tokenizer.decoder).__name__ == "ByteLevel"
        return known

    def special_ids(self, texts: Sequence[str]) -> frozenset[int]:
        """The ids of those ``texts`` that are one special token of this tokenizer (once per texts)."""
        key = ("special_ids", tuple(texts))
        known: frozenset[int] | None = self._facts.get(key)
        if known is None:
            found = (self.tokenizer.token_to_id(text) for text in texts)
            known = self._facts[key] = frozenset(int(token_id) for token_id in found if token_id in self.special_token_ids)
        return known

    def single_token_id(self, text: str) -> int | None:
        """The id of ``text`` when it is exactly one token (a stop string the engine can take as a
        stop token id), else None (once per text)."""
        key = ("single_token_id", (text,))
        if key not in self._facts:
            self._facts[key] = self._single_token_id(text)
        known: int | None = self._facts[key]
        return known

    def _single_token_id(self, text: str) -> int | None:
        if not text:
            return None
        token_id = self.tokenizer.token_to_id(text)
        if token_id is not None:
            return int(token_id)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) == 1 and self.tokenizer.decode(ids, skip_special_tokens=False) == text:
            return int(ids[0])
        return None


def _eos_ids(tokenizer: Tokenizer, config: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    eos = _token_text(config.get("eos_token"))
    if eos is not None:
        token_id = tokenizer.token_to_id(eos)
        if token_id is not None:
            ids.append(int(token_id))
    extra = generation.get("eos_token_id")
    for value in extra if isinstance(extra, list) else [extra]:
        if type(value) is int and value not in ids:
            ids.append(value)
    return tuple(ids)


def load_tokenizer(path: str | os.PathLike[str], *, chat_template: str | None = None) -> ModelTokenizer:
    """Load the tokenizer at ``path``: a directory holding tokenizer.json, or that file itself.

    ``chat_template`` overrides the model's template (a file path or the template text). Raises
    :class:`TokenizerLoadError`.
    """
    location = Path(path).expanduser()
    directory = location if location.is_dir() else location.parent
    tokenizer_file = location if location.is_file() else directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TokenizerLoadError(f"no tokenizer.json at {location}")
    try:
        raw = tokenizer_file.read_bytes()
        tokenizer = Tokenizer.from_buffer(raw)
        tokenizer_json = orjson.loads(raw)
    except Exception as error:  # the library raises its own Exception type for a bad file
        raise TokenizerLoadError(f"cannot load {tokenizer_file}: {error}") from error
    config_file = directory / "tokenizer_config.json"
    config = _read_json(config_file) if config_file.is_file() else {}
    generation_file = directory / "generation_config.json"
    generation = _read_json(generation_file) if generation_file.is_file() else {}

    special: dict[str, Any] = {key: _token_text(config.get(key)) for key in _SPECIAL_TOKEN_KEYS}
    additional = config.get("additional_special_tokens")
    special["additional_special_tokens"] = [
        text for text in (_token_text(item) for item in (additional or [])) if text is not None
    ]
    source = read_chat_template(directory, config, chat_template)
    try:
        template = ChatTemplate.build(source, special) if source is not None else None
    except TemplateCompileError as error:
        raise TokenizerLoadError(str(error)) from error

    bos = special["bos_token"]
    bos_id = tokenizer.token_to_id(bos) if bos else None
    specials = frozenset(
        int(token_id) for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
    )
    return ModelTokenizer(
        path=str(location),
        tokenizer=tokenizer,
        config=config,
        chat_template=template,
        bos_token_id=int(bos_id) if bos_id is not None else None,
        eos_token_ids=_eos_ids(tokenizer, config, generation),
        special_token_ids=specials,
        fast=(
            bpe_encoder(tokenizer_json, tokenizer, name=str(location), source=tokenizer_file)
            if isinstance(tokenizer_json, dict) else None
        ),  # fmt: skip
    )


CacheKey = tuple[str, str | None]


@lru_cache(maxsize=1)
def _load_executor() -> ThreadPoolExecutor:
    """Threads for loads started by :meth:`TokenizerCache.start` (a large tokenizer.json takes ~0.4 s)."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenizer-load")


@lru_cache(maxsize=256)
def _normalised(location: str) -> str:
    """A tokenizer location as the cache keys it (once per location: every engine request looks its
    tokenizer up, and ``Path(...).expanduser()`` is most of that lookup)."""
    if "://" in location:  # a worker's URL for ``resolve``, not a path to normalise
        return location
    return str(Path(location).expanduser())


class TokenizerCache:
    """Loaded tokenizers by (path, chat-template override), least recently used dropped first.

    Safe to use from the event loop and from threads. :meth:`aget` loads on a thread and shares
    one load among the requests that ask for the same tokenizer meanwhile; :meth:`start` begins a
    load without waiting for it. ``resolve`` turns a location that is not a local path (a model-hub
    id, a gRPC worker) into one, on the loading thread (default: the location is the path).
    """

    def __init__(self, maxsize: int = 8, *, resolve: Callable[[str], str | os.PathLike[str]] | None = None) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._resolve = resolve
        self._items: OrderedDict[CacheKey, ModelTokenizer] = OrderedDict()
        self._loading: dict[CacheKey, Future[ModelTokenizer]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(path: str | os.PathLike[str], chat_template: str | None = None) -> CacheKey:
        return (_normalised(os.fspath(path)), chat_template)

    def __len__(self) -> int:
        return len(self._items)

    def peek(self, path: str | os.PathLike[str], chat_template: str | None = None) -> ModelTokenizer | None:
        """The cached tokenizer, or None; never loads."""
        key = self.key(path, chat_template)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def loading(self, path: str | os.PathLike[str], chat_template: str | None = None) -> bool:
        """Whether a load of this tokenizer is under way (the 503 tokenizer_not_ready window)."""
        with self._lock:
            return self.key(path, chat_template) in self._loading

    def put(self, tokenizer: ModelTokenizer, chat_template: str | None = None) -> None:
        with self._lock:
            self._store(self.key(tokenizer.path, chat_template), tokenizer)

    def _store(self, key: CacheKey, tokenizer: ModelTokenizer) -> None:
        self._items[key] = tokenizer
        self._items.move_to_end(key)
        while len(self._items) > self.maxsize:
            self._items.popitem(last=False)

    def evict(self, path: str | os.PathLike[str], chat_template: str | None = None) -> None:
        with self._lock:
            self._items.pop(self.key(path, chat_template), None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def _claim(self, key: CacheKey) -> tuple[ModelTokenizer | None, Future[ModelTokenizer], bool]:
        """(cached, future, owner): the cached tokenizer, else the load to wait on (owner: start it)."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found, Future(), False
            pending = self._loading.get(key)
            if pending is not None:
                return None, pending, False
            pending = Future()
            self._loading[key] = pending
            return None, pending, True

    def _load(self, key: CacheKey, pending: Future[ModelTokenizer]) -> ModelTokenizer:
        try:
            location = self._resolve(key[0]) if self._resolve is not None else key[0]
            loaded = load_tokenizer(location, chat_template=key[1])
        except BaseException as error:
            with self._lock:
                self._loading.pop(key, None)
            pending.set_exception(error)
            raise
        with self._lock:
            self._store(key, loaded)
            self._loading.pop(key, None)
        pending.set_result(loaded)
        return loaded

    def get(self, path: str | os.PathLike[str], chat_template: str | None = None) -> ModelTokenizer:
        """The tokenizer, loaded now if it is not cached (blocks: not for the event loop)."""
        key = self.key(path, chat_template)
        found, pending, owner = self._claim(key)
        if found is not None:
            return found
        if owner:
            return self._load(key, pending)
        return pending.result()

    def start(self, path: str | os.PathLike[str], chat_template: str | None = None) -> Future[ModelTokenizer]:
        """Begin loading this tokenizer on a loading thread unless it is cached or already loading;
        returns at once with the load's future (done already for a cached tokenizer). From the moment
        it returns, :meth:`loading` is true until the load ends."""
        key = self.key(path, chat_template)
        found, pending, owner = self._claim(key)
        if found is not None:
            pending.set_result(found)
        elif owner:
            _load_executor().submit(self._load_quietly, key, pending)
        return pending

    def _load_quietly(self, key: CacheKey, pending: Future[ModelTokenizer]) -> None:
        """A started load: its outcome (a failure too) is the future's, for whoever watches it."""
        try:
            self._load(key, pending)
        except Exception:
            pass

    async def aget(self, path: str | os.PathLike[str], chat_template: str | None = None) -> ModelTokenizer:
        """The tokenizer; a load runs on a thread, and concurrent callers share it."""
        key = self.key(path, chat_template)
        found, pending, owner = self._claim(key)
        if found is not None:
            return found
        if owner:
            return await asyncio.to_thread(self._load, key, pending)
        return await asyncio.wrap_future(pending)

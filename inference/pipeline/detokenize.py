"""The detokenize stage: token ids as the engine streams them → text deltas, incrementally.

Each step decodes only a small window of ids, the way vLLM and SGLang do (a prefix offset and a
read offset): ``prefix`` is the text of ``ids[prefix_offset:read_offset]`` (already sent, kept as
context so the decoder joins pieces as it would in the whole text: spaces of SentencePiece's ``▁``,
byte-level BPE pieces), ``new`` is the text of ``ids[prefix_offset:]``, and the delta is what
``new`` adds to ``prefix``. While ``new`` ends in U+FFFD the last token ends inside a UTF-8
character (a byte-fallback or byte-level piece): nothing is sent and the offsets stay, so the
character is sent whole once its last byte arrives. A step costs two decodes of a few tokens,
whatever the length of the output; one with a ``concatenative`` decoder (byte-level BPE: the text of
ids that start and end on character boundaries is the text of their parts, joined), where the
next step's ``prefix`` is this step's delta (or its whole ``new`` text when the window did not
move), kept instead of decoded again. It is kept only when that holds exactly: the prefix decoded
without U+FFFD (so it ended on a character boundary) and ``new`` began with it.
With ``token_bytes`` (the tokenizer's :class:`TokenBytes`), a step whose known prefix has no
U+FFFD, with no ids held back from an earlier step, whose new ids are ordinary tokens (not special,
nor with a special token's text) whose bytes join to whole UTF-8 not ending in U+FFFD, is not
decoded at all: its delta is those bytes read as UTF-8, which is what the library's decode of the
window adds to the prefix (it joins the same bytes and reads them the same way). Anything else
takes the decoding path.

``skipped_ids`` narrows ``skip_special_tokens`` to a set of ids: those never reach the decoder,
and every other id (special tokens a parser reads, such as Mistral's ``[TOOL_CALLS]``) is decoded as
text. The text is what skipping exactly those ids gives (a skipped token never reaches the decoder
either way), so the deltas still concatenate to the whole output's decode.

Without ``prompt_ids`` the deltas concatenate to ``tokenizer.decode(all_ids)`` exactly (what a
non-streamed answer holds). With ``prompt_ids``, the last few prompt tokens are the first context,
so the first token is decoded as it follows the prompt (a SentencePiece ``▁`` right after the
prompt then stays a space, as in vLLM's and SGLang's outputs).
"""

from __future__ import annotations

from typing import Sequence

from tokenizers import Tokenizer

from inference.pipeline.bpe_encoder import byte_of_char

__all__ = ["IncrementalDetokenizer", "TokenBytes"]

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 5  # prompt tokens decoded before the first output token, when given
_MAX_PROMPT_CONTEXT = 24
_TRIM_AFTER = 256  # drop ids before the window once this many are behind it


class TokenBytes:
    """The bytes each token id stands for under a byte-level BPE decoder (``ByteLevel`` alone),
    for the ids that are not special tokens: each character of the token's text mapped back to its
    byte through the byte-level alphabet, or the text's own UTF-8 when a character is outside it
    (an added token's), as that decoder does before it reads the joined bytes as UTF-8. Filled as
    ids are met (a vocabulary's outputs use a small part of it); shared by every choice of one
    tokenizer (a dict's item set is atomic)."""

    __slots__ = ("_tokenizer", "_special", "_special_texts", "known", "texts")

    def __init__(self, tokenizer: Tokenizer, special_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._special = special_ids
        # The library skips a token by its text: an ordinary id whose text is a special token's too.
        self._special_texts = frozenset(
            added.content for added in tokenizer.get_added_tokens_decoder().values() if added.special
        )
        self.known: dict[int, bytes] = {}
        self.texts: dict[int, str] = {}  # :meth:`text`'s answers, filled as they are met

    def fill(self, token_ids: Sequence[int]) -> bool:
        """Learn the bytes of ``token_ids``; False when one of them has none here (a special token,
        an id the vocabulary lacks)."""
        alphabet = byte_of_char()
        for token_id in token_ids:
            if token_id in self.known:
                continue
            if token_id in self._special or token_id < 0:
                return False
            text = self._tokenizer.id_to_token(token_id)
            if text is None or text in self._special_texts:
                return False
            try:
                self.known[token_id] = bytes([alphabet[char] for char in text])
            except KeyError:
                self.known[token_id] = text.encode("utf-8")
        return True

    def text(self, token_id: int) -> str | None:
        """The text of ``token_id``'s bytes when they are whole UTF-8 without U+FFFD (not empty),
        remembered in :attr:`texts`; else None."""
        data = self.known.get(token_id)
        if data is None:
            if not self.fill((token_id,)):
                return None
            data = self.known[token_id]
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return None
        if not text or _REPLACEMENT in text:
            return None
        self.texts[token_id] = text
        return text

    def joined(self, token_ids: Sequence[int]) -> bytes | None:
        """The bytes of ``token_ids`` joined, learning those not met yet; None when one of them has
        none here."""
        if not self.fill(token_ids):
            return None
        known = self.known
        return b"".join([known[token_id] for token_id in token_ids])


class IncrementalDetokenizer:
    """Turns one choice's token ids into text deltas. Not thread-safe; one per choice."""

    __slots__ = (
        "_tokenizer", "_skip", "_skipped", "_ids", "_prefix_offset", "_read_offset", "_text_length", "_concatenative",
        "_prefix_text", "_token_bytes", "_fast",
    )  # fmt: skip

    def __init__(
        self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = (),
        skipped_ids: frozenset[int] | None = None, concatenative: bool = False, token_bytes: TokenBytes | None = None,
    ) -> None:  # fmt: skip
        """``skipped_ids`` (with ``skip_special_tokens``): skip these ids instead of every special
        token. ``concatenative``: the tokenizer's decoder joins the bytes of each token (byte-level
        BPE), so a window's text is known from the last step's (see the module's docstring).
        ``token_bytes`` (with ``concatenative``): the tokenizer's :class:`TokenBytes`, for steps
        that need no decode."""
        self._tokenizer = tokenizer
        narrowed = skip_special_tokens and skipped_ids is not None
        self._skip = skip_special_tokens and not narrowed
        self._skipped = skipped_ids if narrowed else None
        self._concatenative = concatenative
        self._token_bytes = token_bytes if concatenative else None
        self._prefix_text: str | None = None  # the text of ids[prefix_offset:read_offset], when known
        # step_one's path holds (token bytes, the prefix's text known without U+FFFD, nothing held):
        # set by step_one, unset by every other step.
        self._fast = False
        context = self._prompt_context(self._kept(prompt_ids))
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._text_length = 0  # characters sent so far

    def _prompt_context(self, prompt_ids: Sequence[int]) -> list[int]:
        """The last few prompt ids, starting where the decode does not begin inside a character."""
        if not prompt_ids:
            return []
        size = min(_PROMPT_CONTEXT, len(prompt_ids))
        while size < min(_MAX_PROMPT_CONTEXT, len(prompt_ids)):
            text = self._decode(list(prompt_ids[-size:]))
            if _REPLACEMENT not in text:
                self._prefix_text = text  # the first step's prefix
                break
            size += 1
        return list(prompt_ids[-size:])

    def _kept(self, ids: Sequence[int]) -> Sequence[int]:
        """``ids`` without the skipped ones (when skipping is narrowed to a set)."""
        skipped = self._skipped
        if skipped is None:
            return ids
        return [token_id for token_id in ids if token_id not in skipped]

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=self._skip))

    def copy(self) -> IncrementalDetokenizer:
        """An independent detokenizer in this one's state (a window of ids, not the whole output)."""
        twin = IncrementalDetokenizer.__new__(IncrementalDetokenizer)
        twin._tokenizer, twin._skip, twin._skipped = self._tokenizer, self._skip, self._skipped
        twin._concatenative, twin._prefix_text = self._concatenative, self._prefix_text
        twin._token_bytes = self._token_bytes
        twin._fast = False
        twin._ids = list(self._ids)
        twin._prefix_offset, twin._read_offset, twin._text_length = self._prefix_offset, self._read_offset, self._text_length
        return twin

    @property
    def sent_characters(self) -> int:
        """How many characters the deltas carried so far."""
        return self._text_length

    def step_one(self, token_id: int) -> str:
        """:meth:`step` of one id (an engine's message while it decodes): step's byte-level path for
        an id whose bytes are whole UTF-8, from :attr:`TokenBytes.texts` (no decode); any other
        case is step()'s."""
        skipped = self._skipped
        if skipped is not None and token_id in skipped:
            return ""  # step() keeps nothing of it either
        token_bytes = self._token_bytes
        if token_bytes is not None:
            if not self._fast:  # step()'s byte-level conditions, checked once until another step
                prefix_text = self._prefix_text
                self._fast = prefix_text is not None and self._read_offset == len(self._ids) and _REPLACEMENT not in prefix_text
            if self._fast:
                delta = token_bytes.texts.get(token_id) or token_bytes.text(token_id)
                if delta is not None:  # as step()'s path: the window moves to this id, its text delta
                    ids = self._ids
                    read = self._read_offset
                    ids.append(token_id)
                    self._prefix_offset = read
                    self._prefix_text = delta
                    self._read_offset = read + 1
                    if read > _TRIM_AFTER:
                        del ids[:read]
                        self._read_offset = 1
                        self._prefix_offset = 0
                    self._text_length += len(delta)
                    return delta
        return self.step((token_id,))

    def step(self, token_ids: Sequence[int]) -> str:
        """The text the new ids add ("" while a character is incomplete or the ids add no text)."""
        self._fast = False
        if self._skipped is not None:
            token_ids = self._kept(token_ids)
        if not token_ids:
            return ""
        prefix_text = self._prefix_text
        token_bytes = self._token_bytes
        ids = self._ids
        if (
            token_bytes is not None and prefix_text is not None and self._read_offset == len(ids)
            and _REPLACEMENT not in prefix_text
        ):  # fmt: skip
            known = token_bytes.known
            try:
                data: bytes | None = known[token_ids[0]] if len(token_ids) == 1 else b"".join([known[i] for i in token_ids])
            except KeyError:
                data = token_bytes.joined(token_ids)
            try:
                delta = data.decode() if data is not None else ""
            except UnicodeDecodeError:
                delta = ""
            if delta and delta[-1] != _REPLACEMENT:
                # What the decode below gives then (the prefix's bytes are whole UTF-8, so are the
                # new ones: the window reads as the two texts joined), without the decode.
                ids.extend(token_ids)
                self._prefix_offset = read = self._read_offset
                self._prefix_text = delta
                self._read_offset = len(ids)
                if read > _TRIM_AFTER:
                    del ids[:read]
                    self._read_offset -= read
                    self._prefix_offset = 0
                self._text_length += len(delta)
                return delta
        self._ids.extend(token_ids)
        window = self._ids[self._prefix_offset :]
        new_text = self._decode(window)
        if new_text.endswith(_REPLACEMENT):
            return ""  # the last token ends inside a character: wait for its remaining bytes
        if prefix_text is None:
            prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        whole = new_text.startswith(prefix_text)
        if whole:
            delta = new_text[len(prefix_text) :]
        else:
            # The prefix decoded differently on its own (it ended inside a character that a later
            # token completed): send what follows the longest common beginning.
            common = 0
            for left, right in zip(prefix_text.rstrip(_REPLACEMENT), new_text):
                if left != right:
                    break
                common += 1
            delta = new_text[common:]
        if delta or self._read_offset - self._prefix_offset > _MAX_PROMPT_CONTEXT:
            # Ids that added no text (skipped special tokens) stay in the context: the next window
            # must start on text, or a decoder that strips a leading space would strip it again.
            self._prefix_offset = self._read_offset
            # The new window ids[read_offset:] is the delta's ids: its text is the delta when the old
            # prefix ended on a character boundary (decoded without U+FFFD) and new_text began with it.
            self._prefix_text = delta if self._concatenative and whole and _REPLACEMENT not in prefix_text else None
        else:
            self._prefix_text = new_text  # the window did not move: its text is new_text, decoded
        self._read_offset = len(self._ids)
        if self._prefix_offset > _TRIM_AFTER:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        self._text_length += len(delta)
        return delta

    def flush(self) -> str:
        """At the end of the output: the text still held back (an incomplete character, sent as
        the decoder renders it, U+FFFD included)."""
        self._fast = False
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._prefix_text
        if prefix_text is None:
            prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if new_text.startswith(prefix_text):
            delta = new_text[len(prefix_text) :]
        else:
            delta = new_text[len(prefix_text.rstrip(_REPLACEMENT)) :]
        self._prefix_text = None
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._text_length += len(delta)
        return delta

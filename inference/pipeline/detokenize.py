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

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 5  # prompt tokens decoded before the first output token, when given
_MAX_PROMPT_CONTEXT = 24
_TRIM_AFTER = 256  # drop ids before the window once this many are behind it


class IncrementalDetokenizer:
    """Turns one choice's token ids into text deltas. Not thread-safe; one per choice."""

    __slots__ = (
        "_tokenizer", "_skip", "_skipped", "_ids", "_prefix_offset", "_read_offset", "_text_length", "_concatenative",
        "_prefix_text",
    )  # fmt: skip

    def __init__(
        self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = (),
        skipped_ids: frozenset[int] | None = None, concatenative: bool = False,
    ) -> None:  # fmt: skip
        """``skipped_ids`` (with ``skip_special_tokens``): skip these ids instead of every special
        token. ``concatenative``: the tokenizer's decoder joins the bytes of each token (byte-level
        BPE), so a window's text is known from the last step's (see the module's docstring)."""
        self._tokenizer = tokenizer
        narrowed = skip_special_tokens and skipped_ids is not None
        self._skip = skip_special_tokens and not narrowed
        self._skipped = skipped_ids if narrowed else None
        self._concatenative = concatenative
        self._prefix_text: str | None = None  # the text of ids[prefix_offset:read_offset], when known
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
        twin._ids = list(self._ids)
        twin._prefix_offset, twin._read_offset, twin._text_length = self._prefix_offset, self._read_offset, self._text_length
        return twin

    @property
    def sent_characters(self) -> int:
        """How many characters the deltas carried so far."""
        return self._text_length

    def step(self, token_ids: Sequence[int]) -> str:
        """The text the new ids add ("" while a character is incomplete or the ids add no text)."""
        if self._skipped is not None:
            token_ids = self._kept(token_ids)
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        window = self._ids[self._prefix_offset :]
        new_text = self._decode(window)
        if new_text.endswith(_REPLACEMENT):
            return ""  # the last token ends inside a character: wait for its remaining bytes
        prefix_text = self._prefix_text
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

"""The detokenize stage: token ids as the engine streams them → text deltas, incrementally.

Each step decodes only a small window of ids, the way vLLM and SGLang do (a prefix offset and a
read offset): ``prefix`` is the text of ``ids[prefix_offset:read_offset]`` (already sent, kept as
context so the decoder joins pieces as it would in the whole text: spaces of SentencePiece's ``▁``,
byte-level BPE pieces), ``new`` is the text of ``ids[prefix_offset:]``, and the delta is what
``new`` adds to ``prefix``. While ``new`` ends in U+FFFD the last token ends inside a UTF-8
character (a byte-fallback or byte-level piece): nothing is sent and the offsets stay, so the
character is sent whole once its last byte arrives. A step costs two decodes of a few tokens,
whatever the length of the output.

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

    __slots__ = ("_tokenizer", "_skip", "_skipped", "_ids", "_prefix_offset", "_read_offset", "_text_length")

    def __init__(
        self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = (),
        skipped_ids: frozenset[int] | None = None,
    ) -> None:  # fmt: skip
        """``skipped_ids`` (with ``skip_special_tokens``): skip these ids instead of every special
        token."""
        self._tokenizer = tokenizer
        narrowed = skip_special_tokens and skipped_ids is not None
        self._skip = skip_special_tokens and not narrowed
        self._skipped = skipped_ids if narrowed else None
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
            if _REPLACEMENT not in self._decode(list(prompt_ids[-size:])):
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
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        if new_text.startswith(prefix_text):
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
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if new_text.startswith(prefix_text):
            delta = new_text[len(prefix_text) :]
        else:
            delta = new_text[len(prefix_text.rstrip(_REPLACEMENT)) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._text_length += len(delta)
        return delta

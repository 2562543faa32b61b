"""The stop-matching stage: stop strings over a stream of text deltas, and stop token ids.

:class:`StopMatcher` takes the detokenized deltas of one choice and passes text on as soon as it
cannot be the beginning of a stop string; it holds back only the end of the text that could still
grow into one (at most the longest stop string less one character). When a stop string appears,
in one delta or across several, the text before it is sent (the stop string too with
``no_stop_trim``), the rest of the output is dropped, and :attr:`StopMatcher.matched` names the
stop string (finish_reason ``stop``, ``matched_stop``). Where several stop strings match, the one
that is complete first wins (it ends first in the text; at the same end, the longer one), as when
the text arrives a character at a time, so the outcome does not depend on how the text is split.

Stop token ids (``stop_token_ids``, and the end-of-sequence ids unless ``ignore_eos``) are decided
on ids, before detokenizing: :class:`StopTokens`. Engines apply them themselves when the request
carries them; the helper serves the paths where the gateway must (and checks engine reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["StopMatcher", "StopTokens"]


class StopMatcher:
    """Stop strings over one choice's text deltas. Not thread-safe; one per choice."""

    __slots__ = ("_stops", "_prefixes", "_longest", "_keep_stop", "_held", "matched")

    def __init__(self, stops: Iterable[str], *, no_stop_trim: bool = False) -> None:
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(stop for stop in stops if stop))
        self._prefixes = frozenset(stop[:size] for stop in self._stops for size in range(1, len(stop)))
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._keep_stop = no_stop_trim
        self._held = ""
        self.matched: str | None = None
        """The stop string that ended the output, once one did."""

    @property
    def active(self) -> bool:
        """Whether there are stop strings to match."""
        return bool(self._stops)

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def completes(self, delta: str) -> bool:
        """Whether :meth:`feed` of ``delta`` would end the output (nothing changes)."""
        if self.matched is not None or not self._stops:
            return False
        text = self._held + delta
        return any(stop in text for stop in self._stops)

    def feed(self, delta: str) -> str:
        """The text that can be sent now. After a stop string matched: always ""."""
        if self.matched is not None:
            return ""
        if not self._stops:
            return delta
        text = self._held + delta
        if not text:
            return ""
        found_at = -1
        found_end = -1
        for stop in self._stops:
            at = text.find(stop)
            if at < 0:
                continue
            end = at + len(stop)
            if found_end < 0 or end < found_end or (end == found_end and at < found_at):
                found_at, found_end = at, end
                self.matched = stop
        if self.matched is not None:
            self._held = ""
            end = found_at + len(self.matched) if self._keep_stop else found_at
            return text[:end]
        hold = self._held_length(text)
        if hold:
            self._held = text[-hold:]
            return text[:-hold]
        self._held = ""
        return text

    def _held_length(self, text: str) -> int:
        """The longest end of ``text`` that begins a stop string (0: none)."""
        for size in range(min(len(text), self._longest - 1), 0, -1):
            if text[-size:] in self._prefixes:
                return size
        return 0

    def flush(self) -> str:
        """At the end of the output (no stop string matched): the text held back."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held


@dataclass(frozen=True, slots=True)
class StopTokens:
    """The token ids that end a choice: the request's stop_token_ids, and the model's
    end-of-sequence ids unless ``ignore_eos``."""

    ids: frozenset[int]

    @classmethod
    def build(
        cls, stop_token_ids: Iterable[int] = (), eos_token_ids: Iterable[int] = (), *, ignore_eos: bool = False
    ) -> StopTokens:
        return cls(frozenset((*stop_token_ids, *(() if ignore_eos else eos_token_ids))))

    def find(self, token_ids: Sequence[int]) -> int | None:
        """The position of the first stop token in ``token_ids``, or None. The ids before it are
        the output; the stop token itself is the ``matched_stop`` (not detokenized)."""
        ids = self.ids
        if not ids:
            return None
        if len(token_ids) == 1:  # one token per engine message: the usual case while streaming
            return 0 if token_ids[0] in ids else None
        for position, token_id in enumerate(token_ids):
            if token_id in ids:
                return position
        return None

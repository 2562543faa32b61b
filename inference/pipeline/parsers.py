"""Choosing the parsers of a model: by name (model card, worker label, command-line flag) or from
the model family, and making one per request.

Precedence (spec 3): the model card's ``tool_parser`` / ``reasoning_parser``, else the worker's
labels, else ``--tool-call-parser`` / ``--reasoning-parser``, else the family's default. Every
name given is checked here: an unknown one raises :class:`UnknownParser`, which registration
turns into a failure (and start-up, for a flag: call :func:`check_parser_names`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from inference.pipeline.reasoning import REASONING_PARSERS, ReasoningParser
from inference.pipeline.registry import UnknownParser
from inference.pipeline.tools import TOOL_PARSERS, ToolParser
from inference.schemas.families import ModelFamily, detect_family, family_info

__all__ = [
    "ParserChoice", "UnknownParser", "check_parser_names", "choose_parsers", "default_parsers",
    "reasoning_parser_class", "tool_parser_class",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ParserChoice:
    """The parser names a model uses (None: that kind of parsing is off)."""

    tool_parser: str | None
    reasoning_parser: str | None


def tool_parser_class(name: str) -> type[ToolParser]:
    return TOOL_PARSERS.get(name)


def reasoning_parser_class(name: str) -> type[ReasoningParser]:
    return REASONING_PARSERS.get(name)


def check_parser_names(*, tool_parser: str | None = None, reasoning_parser: str | None = None) -> None:
    """Raise :class:`UnknownParser` for a name no parser answers to (flags at start-up)."""
    if tool_parser:
        TOOL_PARSERS.get(tool_parser)
    if reasoning_parser:
        REASONING_PARSERS.get(reasoning_parser)


def default_parsers(family: ModelFamily | None) -> ParserChoice:
    """The family table's parsers (none for an unknown family)."""
    if family is None:
        return ParserChoice(None, None)
    info = family_info(family)
    return ParserChoice(info.tool_parser, info.reasoning_parser)


def _first(*names: str | None) -> str | None:
    return next((name for name in names if name), None)


def choose_parsers(
    model: str,
    *,
    card: ParserChoice = ParserChoice(None, None),
    labels: ParserChoice = ParserChoice(None, None),
    flags: ParserChoice = ParserChoice(None, None),
    architectures: Sequence[str] = (),
    model_type: str | None = None,
) -> ParserChoice:
    """The parsers of ``model`` by the precedence above; names are checked (UnknownParser)."""
    detected = default_parsers(detect_family(model, architectures=architectures, model_type=model_type))
    chosen = ParserChoice(
        _first(card.tool_parser, labels.tool_parser, flags.tool_parser, detected.tool_parser),
        _first(card.reasoning_parser, labels.reasoning_parser, flags.reasoning_parser, detected.reasoning_parser),
    )
    check_parser_names(tool_parser=chosen.tool_parser, reasoning_parser=chosen.reasoning_parser)
    return chosen

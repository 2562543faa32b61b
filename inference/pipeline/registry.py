"""Parsers registered by the names operators use (the reference gateway's and the engines'
``--tool-call-parser`` / ``--reasoning-parser`` names), NetBox-style: a module registers its class
where it is defined::

    @TOOL_PARSERS.register("qwen", "qwen25", "hermes")
    class HermesToolParser(ToolParser): ...

Names are compared ignoring case, with ``-`` and ``_`` the same (``deepseek-r1`` is
``deepseek_r1``). An unknown name raises :class:`UnknownParser`, which a registration step turns
into a failure (and start-up, for a flag).
"""

from __future__ import annotations

from typing import TypeVar

from inference.upstreams.registry import NamedRegistry

__all__ = ["ParserRegistry", "UnknownParser", "normalize_parser_name"]

T = TypeVar("T")


def normalize_parser_name(name: str) -> str:
    """The form a parser name is stored and looked up in."""
    return name.strip().lower().replace("-", "_")


class UnknownParser(LookupError):
    """No parser of that kind is registered under that name."""

    def __init__(self, kind: str, name: str, known: tuple[str, ...]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(known)}")


class ParserRegistry(NamedRegistry[T]):
    """Parser classes of one kind (tool-call or reasoning), by name and alias."""

    normalize = staticmethod(normalize_parser_name)

    def missing(self, name: str) -> LookupError:
        return UnknownParser(self.kind, name, self.names())

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

from typing import Callable, Generic, TypeVar

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


class ParserRegistry(Generic[T]):
    """Parser classes of one kind (tool-call or reasoning), by name and alias."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._by_name: dict[str, type[T]] = {}

    def register(self, name: str, *aliases: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: ``cls`` answers to ``name`` and each alias. A name is taken once."""

        def add(cls: type[T]) -> type[T]:
            for each in (name, *aliases):
                key = normalize_parser_name(each)
                taken = self._by_name.get(key)
                if taken is not None and taken is not cls:
                    raise ValueError(f"{self.kind} {key!r} is already registered as {taken.__name__}")
                self._by_name[key] = cls
            return cls

        return add

    def get(self, name: str) -> type[T]:
        try:
            return self._by_name[normalize_parser_name(name)]
        except KeyError:
            raise UnknownParser(self.kind, name, self.names()) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and normalize_parser_name(name) in self._by_name

    def names(self) -> tuple[str, ...]:
        """Every registered name and alias, sorted."""
        return tuple(sorted(self._by_name))

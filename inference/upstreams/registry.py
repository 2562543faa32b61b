"""Upstreams registered by name with a decorator (NetBox's registry pattern).

Each kind of upstream (relays by transport, engine clients by runtime) keeps one
:class:`NamedRegistry`; a module registers its class where it is defined::

    @RELAYS.register(Transport.HTTP)
    class HttpRelay(Relay): ...

and the data plane looks the class up by name, never through a hard-coded dict or an if/else chain.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["NamedRegistry", "UnknownUpstream"]

T = TypeVar("T")


class UnknownUpstream(LookupError):
    """No upstream of that kind is registered under that name."""


class NamedRegistry(Generic[T]):
    """Classes of one kind (a transport's relay, a runtime's engine client, a family's parser), by
    name and alias. Subclasses may normalise names (:meth:`normalize`) and raise their own error for
    an unknown one (:meth:`missing`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._by_name: dict[str, type[T]] = {}

    @staticmethod
    def normalize(name: str) -> str:
        """The form a name is stored and looked up in."""
        return str(name)

    def missing(self, name: str) -> LookupError:
        """The error for a name nothing is registered under."""
        return UnknownUpstream(f"no {self.kind} is registered for {name!r}")

    def register(self, name: str, *aliases: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: make ``cls`` the one called ``name`` (and each alias). A name is taken once."""

        def add(cls: type[T]) -> type[T]:
            for each in (name, *aliases):
                key = self.normalize(each)
                taken = self._by_name.get(key)
                if taken is not None and taken is not cls:
                    raise ValueError(f"{self.kind} {key!r} is already registered as {taken.__name__}")
                self._by_name[key] = cls
            return cls

        return add

    def get(self, name: str) -> type[T]:
        try:
            return self._by_name[self.normalize(name)]
        except KeyError:
            raise self.missing(name) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.normalize(name) in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._by_name))

    def names(self) -> tuple[str, ...]:
        """Every registered name and alias, sorted."""
        return tuple(sorted(self._by_name))

    def items(self) -> tuple[tuple[str, type[T]], ...]:
        return tuple(self._by_name.items())

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
    """Classes of one kind of upstream, by name (a transport, a runtime)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._by_name: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: make ``cls`` the upstream called ``name``. A name is registered once."""

        def add(cls: type[T]) -> type[T]:
            key = str(name)
            if key in self._by_name and self._by_name[key] is not cls:
                raise ValueError(f"{self.kind} {key!r} is already registered as {self._by_name[key].__name__}")
            self._by_name[key] = cls
            return cls

        return add

    def get(self, name: str) -> type[T]:
        try:
            return self._by_name[str(name)]
        except KeyError:
            raise UnknownUpstream(f"no {self.kind} is registered for {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return str(name) in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._by_name))

    def items(self) -> tuple[tuple[str, type[T]], ...]:
        return tuple(self._by_name.items())

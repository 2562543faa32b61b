"""Upstreams registered under a key with a decorator (NetBox's registry pattern).

Each kind of upstream keeps one registry: relays by transport (:data:`~inference.upstreams.base.RELAYS`),
engine clients by transport and runtime (:data:`~inference.upstreams.engine.ENGINE_CLIENTS`), each
engine transport's connector (:data:`~inference.upstreams.engine.ENGINE_CONNECTORS`). A module
registers what it defines where it defines it::

    @RELAYS.register(Transport.HTTP)
    class HttpRelay(Relay): ...

and the data plane looks it up by key, never through a hard-coded dict or an if/else chain.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, Iterator, TypeVar

__all__ = ["KeyedRegistry", "NamedRegistry", "UnknownUpstream"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


class UnknownUpstream(LookupError):
    """No upstream of that kind is registered under that key."""


class KeyedRegistry(Generic[K, V]):
    """Entries of one kind (classes or functions) by key and alias. Subclasses may normalise keys
    (:meth:`normalize`) and raise their own error for an unknown one (:meth:`missing`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._by_name: dict[K, V] = {}

    def normalize(self, key: K) -> K:
        """The form a key is stored and looked up in."""
        return key

    def missing(self, key: K) -> LookupError:
        """The error for a key nothing is registered under."""
        return UnknownUpstream(f"no {self.kind} is registered for {key!r}")

    def register(self, key: K, *aliases: K) -> Callable[[V], V]:
        """Decorator: make ``entry`` the one under ``key`` (and each alias). A key is taken once."""

        def add(entry: V) -> V:
            for each in (key, *aliases):
                normal = self.normalize(each)
                taken = self._by_name.get(normal)
                if taken is not None and taken is not entry:
                    name = getattr(taken, "__name__", repr(taken))
                    raise ValueError(f"{self.kind} {normal!r} is already registered as {name}")
                self._by_name[normal] = entry
            return entry

        return add

    def get(self, key: K) -> V:
        try:
            return self._by_name[self.normalize(key)]
        except (KeyError, TypeError, ValueError):
            raise self.missing(key) from None

    def __contains__(self, key: object) -> bool:
        try:
            return self.normalize(key) in self._by_name  # type: ignore[arg-type]
        except (TypeError, ValueError, IndexError, AttributeError):
            return False

    def __iter__(self) -> Iterator[K]:
        return iter(tuple(self._by_name))

    def items(self) -> tuple[tuple[K, V], ...]:
        return tuple(self._by_name.items())


class NamedRegistry(KeyedRegistry[str, "type[T]"], Generic[T]):
    """Classes of one kind (a transport's relay, a family's parser), by name and alias."""

    @staticmethod
    def normalize(name: str) -> str:
        """The form a name is stored and looked up in."""
        return str(name)

    def missing(self, name: str) -> LookupError:
        """The error for a name nothing is registered under."""
        return UnknownUpstream(f"no {self.kind} is registered for {name!r}")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.normalize(name) in self._by_name

    def names(self) -> tuple[str, ...]:
        """Every registered name and alias, sorted."""
        return tuple(sorted(self._by_name))

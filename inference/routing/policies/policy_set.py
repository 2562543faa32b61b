"""Policies by name, and the set a gateway routes with: --policy plus --model-policy overrides."""

from __future__ import annotations

from typing import Callable, Mapping

from common.config import GatewayConfig
from inference.routing.policies.base import SelectionPolicy
from inference.routing.policies.cache_aware import CacheAware
from inference.routing.policies.consistent_hashing import ConsistentHashing
from inference.routing.policies.manual import Manual
from inference.routing.policies.simple import LeastLoad, PowerOfTwo, RandomChoice, RoundRobin
from inference.routing.registry import RegistrySnapshot

__all__ = ["PolicySet", "make_policy"]

_POLICIES: dict[str, Callable[[GatewayConfig], SelectionPolicy]] = {
    RoundRobin.name: lambda _: RoundRobin(),
    RandomChoice.name: lambda _: RandomChoice(),
    PowerOfTwo.name: lambda _: PowerOfTwo(),
    LeastLoad.name: lambda _: LeastLoad(),
    CacheAware.name: CacheAware.from_config,
    ConsistentHashing.name: lambda _: ConsistentHashing(),
    Manual.name: lambda _: Manual(),
}


def make_policy(name: str, config: GatewayConfig | None = None) -> SelectionPolicy:
    """A new policy instance by its --policy name, tuned by ``config`` (default: the defaults)."""
    try:
        factory = _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}") from None
    return factory(config or GatewayConfig())


class PolicySet:
    """The default policy plus per-model overrides, each override its own instance (its own state).

    ``observe`` is called with every snapshot the request path reads; when the snapshot changed, the
    workers that left the registry are forgotten by every policy. The check is one identity compare.
    """

    def __init__(self, default: SelectionPolicy, per_model: Mapping[str, SelectionPolicy] | None = None) -> None:
        self.default = default
        self.per_model: dict[str, SelectionPolicy] = dict(per_model or {})
        self._snapshot: RegistrySnapshot | None = None
        self._worker_ids: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> PolicySet:
        """``--policy`` for every model, ``--model-policy MODEL=POLICY`` for MODEL (an alias given
        with --model-alias names its model)."""
        aliases = dict(config.model_aliases)
        per_model = {aliases.get(model, model): make_policy(name, config) for model, name in config.model_policies}
        return cls(make_policy(config.policy, config), per_model)

    def for_model(self, model: str) -> SelectionPolicy:
        return self.per_model.get(model, self.default)

    def forget(self, worker_id: str) -> None:
        self.default.forget(worker_id)
        for policy in self.per_model.values():
            policy.forget(worker_id)

    def observe(self, snapshot: RegistrySnapshot) -> None:
        if snapshot is self._snapshot:
            return
        ids = frozenset(handle.id for handle in snapshot.workers)
        if self._snapshot is not None:
            for worker_id in self._worker_ids - ids:
                self.forget(worker_id)
        self._snapshot = snapshot
        self._worker_ids = ids

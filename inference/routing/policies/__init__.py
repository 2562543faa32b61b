"""Worker selection policies, looked up by name (--policy, --model-policy), one module each."""

from __future__ import annotations

from inference.routing.policies.base import SelectionPolicy, SelectionRequest, least_loaded
from inference.routing.policies.cache_aware import CacheAware
from inference.routing.policies.consistent_hashing import ConsistentHashing
from inference.routing.policies.manual import Manual
from inference.routing.policies.policy_set import PolicySet, make_policy
from inference.routing.policies.simple import LeastLoad, PowerOfTwo, RandomChoice, RoundRobin

__all__ = [
    "SelectionRequest",
    "SelectionPolicy",
    "least_loaded",
    "RoundRobin",
    "RandomChoice",
    "PowerOfTwo",
    "LeastLoad",
    "CacheAware",
    "ConsistentHashing",
    "Manual",
    "PolicySet",
    "make_policy",
]

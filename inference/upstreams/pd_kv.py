"""vLLM-style PD: which KV connector a prefill worker uses and the kv_transfer_params each leg of a
sequential prefill-then-decode carries (the reference gateway's rules, read from its sources).

* NIXL (``NixlConnector``): the prefill leg is tagged ``{"do_remote_decode": true,
  "do_remote_prefill": false}``; the engine returns the handoff params in its last output, relayed
  as they are to the decode leg. No params back: the decode recomputes the prompt (a KV transfer
  failure, counted).
* Mooncake (``MooncakeConnector``): push-based, nothing comes back. With the prefill engine's
  kv_engine_id known the gateway mints a transfer id and tags both legs; without it (or for n > 1)
  the decode leg gets the typed ``remote_host``/``remote_port`` of the prefill's bootstrap server
  (port 8998 when unset).
* Anything else (passthrough): params the prefill returned are relayed, if any.

The KV handoff has one consumer: for n > 1 nothing is relayed or minted (each of the decode's
choices would pull, and the first to finish would free the blocks under the others).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum

import orjson

from inference.routing.pd import GRPC_DEFAULT_BOOTSTRAP_PORT
from inference.upstreams.engine import KvTransfer

__all__ = [
    "MOONCAKE_CONNECTOR",
    "NIXL_CONNECTOR",
    "NIXL_PREFILL_KV_PARAMS",
    "KvMode",
    "KvPlan",
    "DecodeKv",
    "effective_kv_engine_id",
    "kv_plan",
    "SEQUENTIAL_PD_RUNTIMES",
]

SEQUENTIAL_PD_RUNTIMES = frozenset({"vllm"})  # runtimes that hand the KV over by kv_transfer_params

MOONCAKE_CONNECTOR = "MooncakeConnector"
NIXL_CONNECTOR = "NixlConnector"
NIXL_PREFILL_KV_PARAMS = '{"do_remote_decode":true,"do_remote_prefill":false}'


class KvMode(StrEnum):
    """The connector mode, as the gw_pd_kv_connector_mode_total label names it."""

    MOONCAKE = "mooncake"
    NIXL = "nixl"
    PASSTHROUGH = "passthrough"


def effective_kv_engine_id(base: str | None, dp_size: int | None, dp_rank: int | None) -> str | None:
    """The connector id of the engine core serving the prefill leg: with data parallelism the cores
    suffix the configured id ``{base}_dp{rank}``, so only a pinned rank names one."""
    if not base:
        return None
    if (dp_size or 1) > 1:
        return f"{base}_dp{dp_rank}" if dp_rank is not None else None
    return base


# What the decode leg carries: a JSON string, or the typed remote host and port, or nothing.
DecodeKv = KvTransfer


@dataclass(frozen=True, slots=True)
class KvPlan:
    """One sequential PD request's KV handoff."""

    mode: KvMode
    prefill_json: str | None  # the kv_transfer_params_json of the prefill leg
    relay: bool  # whether params the prefill engine returns go on to the decode leg
    host: str
    port: int
    engine_id: str | None
    transfer_id: str | None  # Mooncake with a known engine id: the minted correlation id

    def decode(self, returned: str | None) -> tuple[DecodeKv, bool]:
        """The decode leg's params given what the prefill engine returned; the flag is True when a
        KV transfer was expected but the prefill returned nothing (the decode recomputes)."""
        if self.mode is KvMode.MOONCAKE:
            if self.transfer_id is not None and self.engine_id is not None:
                params = {
                    "do_remote_decode": False,
                    "do_remote_prefill": True,
                    "transfer_id": self.transfer_id,
                    "remote_engine_id": self.engine_id,
                    "remote_bootstrap_addr": f"http://{self.host}:{self.port}",
                }
                return DecodeKv(json=orjson.dumps(params).decode()), False
            return DecodeKv(remote_host=self.host, remote_port=self.port), False
        if self.relay and returned:
            return DecodeKv(json=returned), False
        return DecodeKv(), self.mode is KvMode.NIXL and self.relay


def kv_plan(
    kv_connector: str | None,
    bootstrap_host: str,
    bootstrap_port: int | None,
    kv_engine_id: str | None,
    n: int = 1,
) -> KvPlan:
    """The KV handoff for a prefill worker with ``kv_connector`` (spec field or engine report),
    its bootstrap host and port and its effective kv engine id, for a request of ``n`` choices."""
    relay = n <= 1
    port = bootstrap_port or GRPC_DEFAULT_BOOTSTRAP_PORT
    if kv_connector == MOONCAKE_CONNECTOR:
        engine_id = kv_engine_id or None
        transfer_id = f"xfer-{uuid.uuid4()}" if engine_id is not None and relay else None
        prefill_json = None
        if transfer_id is not None:
            prefill_json = orjson.dumps(
                {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}
            ).decode()
        return KvPlan(KvMode.MOONCAKE, prefill_json, relay, bootstrap_host, port, engine_id, transfer_id)
    if kv_connector == NIXL_CONNECTOR:
        return KvPlan(KvMode.NIXL, NIXL_PREFILL_KV_PARAMS if relay else None, relay, bootstrap_host, port, None, None)
    return KvPlan(KvMode.PASSTHROUGH, None, relay, bootstrap_host, port, None, None)

"""The PD disaggregation metrics of the catalog (spec 3): gw_pd_* histograms and counters, in the
gateway's metrics registry (:mod:`common.telemetry`), with the helpers the PD dispatch calls.

- ``gw_pd_ttft_seconds``: dispatch to the decode worker's answer head (HTTP) or first output (gRPC);
- ``gw_pd_prefill_duration_seconds``: dispatch to the prefill side's end;
- ``gw_pd_kv_transfer_duration_seconds``: sequential PD, the prefill's end to the decode's first
  output (the KV transfer window);
- ``gw_pd_kv_connector_mode_total{mode}``: sequential PD requests per connector mode;
- ``gw_pd_bootstrap_failures_total``: requests whose bootstrap could not be set up: the prefill
  worker's bootstrap host cannot be derived from its URL (nothing is sent), or a side answered that
  its bootstrap (the rendezvous of the two engines) failed;
- ``gw_pd_kv_transfer_failures_total``: a side answered that the KV transfer failed, a vLLM decode
  engine ended its request with finish reason ``error`` (its KV load failed, under
  ``kv_load_failure_policy: fail``), or a NIXL prefill returned no params (the decode recomputes);
- ``gw_pd_admission_waits_total``: PD requests admitted after waiting for a load report that freed
  their overloaded pair (:func:`inference.kit.pd_route.admit_pair`);
- ``gw_pd_admission_sheds_total``: PD requests shed because no report freed one within
  --pd-admission-wait-secs (503 worker_overload_protection_shed).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# The gateway's one memo of labelled children (telemetry's: .labels() validates and locks on every call).
from common.telemetry import DEFAULT_DURATION_BUCKETS, REGISTRY, _child, bounded_model

__all__ = [
    "PD_TTFT",
    "PD_PREFILL_DURATION",
    "PD_KV_TRANSFER_DURATION",
    "PD_KV_CONNECTOR_MODE",
    "PD_BOOTSTRAP_FAILURES",
    "PD_KV_TRANSFER_FAILURES",
    "PD_ADMISSION_WAITS",
    "PD_ADMISSION_SHEDS",
    "record_pd_ttft",
    "record_pd_prefill",
    "record_pd_kv_transfer",
    "record_kv_connector_mode",
    "reported_failure",
    "record_reported_failure",
]

_PD = ("backend_type", "model", "runtime")

PD_TTFT = Histogram("gw_pd_ttft_seconds", "PD: dispatch to the decode side's first answer", _PD,
                    buckets=DEFAULT_DURATION_BUCKETS, registry=REGISTRY)
PD_PREFILL_DURATION = Histogram("gw_pd_prefill_duration_seconds", "PD: dispatch to the prefill side's end", _PD,
                                buckets=DEFAULT_DURATION_BUCKETS, registry=REGISTRY)
PD_KV_TRANSFER_DURATION = Histogram(
    "gw_pd_kv_transfer_duration_seconds", "PD: the prefill's end to the decode's first output (sequential PD)", _PD,
    buckets=DEFAULT_DURATION_BUCKETS, registry=REGISTRY,
)
PD_KV_CONNECTOR_MODE = Counter("gw_pd_kv_connector_mode_total", "Sequential PD requests per KV connector mode",
                               ("mode",), registry=REGISTRY)
PD_BOOTSTRAP_FAILURES = Counter("gw_pd_bootstrap_failures_total", "PD requests whose bootstrap could not be injected",
                                registry=REGISTRY)
PD_KV_TRANSFER_FAILURES = Counter("gw_pd_kv_transfer_failures_total", "PD KV handoffs expected and not given",
                                  registry=REGISTRY)
PD_ADMISSION_WAITS = Counter("gw_pd_admission_waits_total", "PD requests admitted after waiting for an overloaded pair",
                             registry=REGISTRY)
PD_ADMISSION_SHEDS = Counter("gw_pd_admission_sheds_total", "PD requests shed by PD admission", registry=REGISTRY)

def record_pd_ttft(model: str | None, runtime: str, seconds: float) -> None:
    _child(PD_TTFT, "pd", bounded_model(model), runtime).observe(seconds)


def record_pd_prefill(model: str | None, runtime: str, seconds: float) -> None:
    _child(PD_PREFILL_DURATION, "pd", bounded_model(model), runtime).observe(seconds)


def record_pd_kv_transfer(model: str | None, runtime: str, seconds: float) -> None:
    _child(PD_KV_TRANSFER_DURATION, "pd", bounded_model(model), runtime).observe(seconds)


def record_kv_connector_mode(mode: str) -> None:
    _child(PD_KV_CONNECTOR_MODE, mode).inc()


# What an engine answers when a PD side's rendezvous or KV transfer failed. SGLang aborts the request
# with status 500 and one of "Prefill bootstrap failed for request ...", "Decode handshake failed for
# request ..." (the bootstrap), "Prefill transfer failed for request ...", "Decode transfer failed
# for request ..." (the KV transfer; the connector's exception, KVTransferError(...), appended): the
# HTTP answer's error message, the gRPC status details. Bootstrap is looked for first: a failed
# bootstrap's message may carry the connector's KVTransferError too.
_BOOTSTRAP_REPORTS = ("bootstrap failed", "handshake failed")
_KV_TRANSFER_REPORTS = ("transfer failed", "kvtransfererror")


def reported_failure(text: str) -> str | None:
    """``"bootstrap"`` or ``"kv_transfer"`` when an engine's error ``text`` reports that PD failure,
    else None (any other failure is not one of these)."""
    lowered = text.lower()
    if any(report in lowered for report in _BOOTSTRAP_REPORTS):
        return "bootstrap"
    if any(report in lowered for report in _KV_TRANSFER_REPORTS):
        return "kv_transfer"
    return None


def record_reported_failure(text: str) -> str | None:
    """Count the PD failure an engine's error ``text`` reports (:func:`reported_failure`); which."""
    kind = reported_failure(text)
    if kind == "bootstrap":
        PD_BOOTSTRAP_FAILURES.inc()
    elif kind == "kv_transfer":
        PD_KV_TRANSFER_FAILURES.inc()
    return kind

"""What the admin console shows about workers and the form it adds them with.

Read side: live state from this process's registry snapshot (load, circuit breaker), the job
status, and the stored spec as JSON (never the api_key). Write side: :class:`WorkerAddForm` turns
the form's fields into a spec body and parses it with :func:`parse_worker_spec`, so the console
refuses exactly what POST /workers refuses. Nothing here calls the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from django import forms
from django.contrib.admin import widgets
from django.utils import timezone

from administration.models import Worker, WorkerStatus, WorkerType
from administration.store_ranges import column_range
from inference.routing.workers import RuntimeType
from administration.worker_spec import SpecRuleError, SpecTypeError, WorkerSpec, parse_worker_spec
from common.urls import url_has_credentials
from administration.workers import job_status, pd_pairing_of, spec_fields
from inference.routing.registry import REGISTRY, RegistrySnapshot
from inference.routing.workers import WorkerHandle

__all__ = [
    "LiveState",
    "JobSummary",
    "WorkerAddForm",
    "live_state",
    "job_summary",
    "stored_spec",
    "parse_labels",
    "format_age",
    "PdGroup",
    "pd_groups",
    "dp_ranks",
]

# What the priority column holds (the API checks the same range).
_PRIORITY_RANGE = column_range(Worker._meta.get_field("priority"))

# Breaker state shown for a worker the registry knows whose handle carries no breaker yet.
DEFAULT_BREAKER_STATE = "closed"


@dataclass(frozen=True, slots=True)
class LiveState:
    """A worker as this gateway process's registry snapshot sees it (None: not in the snapshot)."""

    in_snapshot: bool
    load: int | None
    breaker_state: str | None
    # The load monitor's last report (one entry per data-parallel rank; None: not polled or failed).
    engine_load: tuple[dict[str, Any], ...] | None = None
    overloaded: bool = False


_NOT_LIVE = LiveState(in_snapshot=False, load=None, breaker_state=None)
_index: tuple[RegistrySnapshot, dict[str, WorkerHandle]] | None = None


def _handles() -> dict[str, WorkerHandle]:
    """Handles by worker id, rebuilt only when the snapshot changes (one dict per list page)."""
    global _index
    snapshot = REGISTRY.snapshot
    cached = _index
    if cached is None or cached[0] is not snapshot:
        cached = (snapshot, {handle.id: handle for handle in snapshot.workers})
        _index = cached
    return cached[1]


def _breaker_state(handle: WorkerHandle) -> str:
    """``handle.breaker_state`` when the handle has one, else the state of the breaker kept with the
    live load (``handle.load.breaker.state``), else closed (no breaker on this worker)."""
    state: Any = getattr(handle, "breaker_state", None)
    if callable(state):
        state = state()
    if state is None:
        state = getattr(getattr(handle.load, "breaker", None), "state", None)
    if state is None:
        return DEFAULT_BREAKER_STATE
    return str(getattr(state, "value", state))


def live_state(worker: Worker) -> LiveState:
    handle = _handles().get(str(worker.pk))
    if handle is None:
        return _NOT_LIVE
    return LiveState(
        in_snapshot=True,
        load=handle.load.in_flight,
        breaker_state=_breaker_state(handle),
        engine_load=handle.load.engine_load,
        overloaded=handle.load.overloaded,
    )


@dataclass(frozen=True, slots=True)
class JobSummary:
    job_type: str
    state: str
    message: str | None
    updated_at: datetime

    @property
    def age(self) -> str:
        return format_age(self.updated_at)


def job_summary(worker: Worker) -> JobSummary | None:
    """The spec's job_status (queued, running, or failed within the retention) as the console shows it."""
    status = job_status(worker)
    if status is None or worker.job_updated_at is None:
        return None
    return JobSummary(
        job_type=status["job_type"], state=status["status"], message=status["message"], updated_at=worker.job_updated_at
    )


def format_age(moment: datetime, now: datetime | None = None) -> str:
    seconds = max(0, int(((now or timezone.now()) - moment).total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def stored_spec(worker: Worker) -> dict[str, Any]:
    """The worker's stored spec as a PUT body would carry it, without api_key (write-only)."""
    spec = spec_fields(worker)
    spec.update({key: value for key, value in worker.settings.items() if key != "api_key"})
    return spec


_PD_ROLES = (WorkerType.PREFILL, WorkerType.DECODE)


@dataclass(slots=True)
class PdGroup:
    """Prefill and decode workers of one model sharing one pairing key (pd_pairing): the workers PD
    routing may pair with each other. ``model`` is empty for workers that serve any model."""

    model: str
    pairing: str
    prefill: list[Worker] = field(default_factory=list)
    decode: list[Worker] = field(default_factory=list)

    @property
    def ready_prefill(self) -> int:
        return sum(1 for worker in self.prefill if worker.status == WorkerStatus.READY)

    @property
    def ready_decode(self) -> int:
        return sum(1 for worker in self.decode if worker.status == WorkerStatus.READY)

    @property
    def paired(self) -> bool:
        """At least one ready worker on each side: requests for the model can be served by a pair."""
        return self.ready_prefill > 0 and self.ready_decode > 0

    @property
    def state(self) -> str:
        if self.paired:
            return "paired"
        missing = [side for side, ready in (("prefill", self.ready_prefill), ("decode", self.ready_decode)) if not ready]
        return "no ready " + " or ".join(missing) + " worker"


def pd_groups(workers: Iterable[Worker]) -> list[PdGroup]:
    """The prefill and decode workers grouped by (model, pairing key), sorted; encode and regular
    workers are left out. No query: the rows the caller already read."""
    groups: dict[tuple[str, str], PdGroup] = {}
    for worker in workers:
        if worker.worker_type not in _PD_ROLES:
            continue
        pairing = pd_pairing_of(worker) or ""
        group = groups.setdefault((worker.model_id, pairing), PdGroup(worker.model_id, pairing))
        (group.prefill if worker.worker_type == WorkerType.PREFILL else group.decode).append(worker)
    return [groups[key] for key in sorted(groups)]


def dp_ranks(live: LiveState) -> list[dict[str, Any]]:
    """The load monitor's last report per data-parallel rank, as the console shows it."""
    return [
        {
            "dp_rank": entry.get("dp_rank", index),
            "running": int(entry.get("num_running_reqs") or 0),
            "waiting": int(entry.get("num_waiting_reqs") or 0),
            "token_usage": float(entry.get("token_usage") or 0.0),
        }
        for index, entry in enumerate(live.engine_load or ())
    ]


def parse_labels(text: str) -> dict[str, str]:
    """``key=value`` lines (blank lines skipped) into a labels object. Raises ValueError."""
    labels: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"line {number}: expected key=value, got {line!r}")
        labels[key.strip()] = value.strip()
    return labels


class WorkerAddForm(forms.Form):
    """The console's POST /workers. ``spec`` is set once the form is valid."""

    url = forms.CharField(
        label="URL",
        max_length=2048,
        widget=widgets.AdminTextInputWidget(attrs={"placeholder": "http://10.0.0.5:8000", "autocomplete": "off"}),
        help_text="http://, https://, grpc://, grpcs:// or ipc://path. One registration per URL.",
    )
    model_id = forms.CharField(
        label="Model id",
        required=False,
        max_length=512,
        widget=widgets.AdminTextInputWidget(attrs={"autocomplete": "off"}),
        help_text="Optional. Empty: the model the engine reports.",
    )
    runtime_type = forms.ChoiceField(
        label="DataPlane type", choices=RuntimeType.choices, initial=RuntimeType.UNSPECIFIED
    )
    worker_type = forms.ChoiceField(label="Worker type", choices=WorkerType.choices, initial=WorkerType.REGULAR)
    api_key = forms.CharField(
        label="API key",
        required=False,
        strip=False,
        max_length=512,
        widget=forms.PasswordInput(render_value=False, attrs={"class": "vTextField", "autocomplete": "new-password"}),
        help_text="Optional, write-only: the key the gateway presents to the worker. It is never shown again.",
    )
    labels = forms.CharField(
        label="Labels",
        required=False,
        widget=widgets.AdminTextareaWidget(attrs={"rows": 4, "placeholder": "region=eu\nrealtime=true"}),
        help_text="One key=value per line; merged over the labels the worker reports.",
    )
    priority = forms.IntegerField(
        label="Priority",
        initial=50,
        min_value=_PRIORITY_RANGE[0],
        max_value=_PRIORITY_RANGE[1],
        widget=widgets.AdminIntegerFieldWidget(),
    )
    cost = forms.FloatField(label="Cost", initial=1.0, widget=widgets.AdminTextInputWidget(attrs={"class": "vIntegerField"}))
    # Prefill/decode/encode and ZMQ fields: typed here, ranged and ruled by parse_worker_spec as the API.
    pairing_protocol = forms.CharField(
        label="Pairing protocol",
        required=False,
        max_length=256,
        widget=widgets.AdminTextInputWidget(attrs={"autocomplete": "off"}),
        help_text="Prefill or decode worker: explicit pairing key (the pairing_protocol label); a prefill and a "
                  "decode worker pair only when their keys are equal. Empty: runtime/transport/layout.",
    )
    bootstrap_port = forms.IntegerField(
        label="Bootstrap port",
        required=False,
        widget=widgets.AdminIntegerFieldWidget(),
        help_text="Prefill or encode worker: its KV bootstrap port (gRPC uses 8998 when empty).",
    )
    kv_connector = forms.CharField(
        label="KV connector", required=False, max_length=256, widget=widgets.AdminTextInputWidget(),
        help_text="Overrides the engine-reported connector (e.g. mooncake, nixl).",
    )
    kv_engine_id = forms.CharField(
        label="KV engine id", required=False, max_length=256, widget=widgets.AdminTextInputWidget(),
        help_text="KV engine ID for PD; empty: the engine-reported one.",
    )
    dp_size = forms.IntegerField(
        label="DP size",
        required=False,
        widget=widgets.AdminIntegerFieldWidget(),
        help_text="ipc:// worker: number of data-parallel engines dialing one socket set (above 1: a grouped worker).",
    )
    zmq_handshake_address = forms.CharField(
        label="ZMQ handshake address",
        required=False,
        max_length=512,
        widget=widgets.AdminTextInputWidget(attrs={"placeholder": "tcp://127.0.0.1:25000", "autocomplete": "off"}),
        help_text="ipc:// worker: the tcp:// address the gateway binds for the engine handshake. Empty: derived "
                  "from the ipc:// path.",
    )

    _SPEC_FIELDS = ("url", "runtime_type", "worker_type", "api_key", "labels", "priority", "cost", "bootstrap_port",
                    "kv_connector", "kv_engine_id", "dp_size", "zmq_handshake_address")
    _OPTIONAL_FIELDS = ("bootstrap_port", "kv_connector", "kv_engine_id", "dp_size", "zmq_handshake_address")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec: WorkerSpec | None = None

    def clean_labels(self) -> dict[str, str]:
        try:
            return parse_labels(self.cleaned_data.get("labels") or "")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        body: dict[str, Any] = {
            "url": data["url"].strip(),
            "runtime_type": data["runtime_type"],
            "worker_type": data["worker_type"],
            "labels": data["labels"],
            "priority": data["priority"],
            "cost": data["cost"],
        }
        if data.get("model_id", "").strip():
            body["models"] = [{"id": data["model_id"].strip()}]
        if data.get("api_key"):
            body["api_key"] = data["api_key"]
        if (data.get("pairing_protocol") or "").strip():
            body["labels"] = {**body["labels"], "pairing_protocol": data["pairing_protocol"].strip()}
        for name in self._OPTIONAL_FIELDS:
            value = data.get(name)
            if isinstance(value, str):
                value = value.strip()
            if value is not None and value != "":
                body[name] = value
        try:
            self.spec = parse_worker_spec(body)
        except (SpecTypeError, SpecRuleError) as exc:
            self.add_error(self._field_of(exc), str(exc))
            if url_has_credentials(body["url"]):  # the form comes back without the password in it
                self.data = {**dict(self.data.items()), "url": ""}
        return data

    def _field_of(self, exc: Exception) -> str | None:
        """The form field a spec error names (other rule errors are about the URL)."""
        message = str(exc)
        if message.startswith("models"):
            return "model_id"
        if message.startswith("labels.pairing_protocol"):
            return "pairing_protocol"
        for name in self._SPEC_FIELDS:
            if message.startswith(name):
                return name
        return "url" if isinstance(exc, SpecRuleError) else None

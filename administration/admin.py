"""The admin console for workers, per-tenant rate limits and token budgets (staff login at /admin/).

An adapter like the /workers API: each page or action parses its input, calls one function of
administration/workers.py and renders the result. The stored spec is read-only here (edits go
through PUT/PATCH /workers/{id}); the api_key is write-only and never rendered.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from administration import usage_admin  # noqa: F401  # registers the prices, request log and usage pages
from administration.console import WorkerAddForm, dp_ranks, job_summary, live_state, pd_groups, stored_spec
from administration.fleet_page import fleet_urls
from administration.models import RegisteredTokenizer, TenantBudget, TenantRateLimit, Worker, WorkerStatus, WorkerType
from administration.tenant_budgets import delete_tenant_budgets, flag_tenant_budget, save_tenant_budget
from administration.tenant_limits import delete_tenant_rate_limits, flag_tenant_limit, save_tenant_rate_limit
from administration.tokenizers import purge_expired_tokenizers, remove_tokenizer
from administration.workers import (
    WorkerError,
    create_worker,
    drain_worker,
    handshake_address_of,
    kv_field,
    pd_pairing_of,
    remove_worker,
    reregister_worker,
)
from common.config import current_config

__all__ = ["WorkerAdmin", "TenantRateLimitAdmin", "TenantBudgetAdmin", "RegisteredTokenizerAdmin"]

_EMPTY = "—"
_ADD_FIELDSETS = [
    (None, {"fields": ["url", "model_id", "runtime_type", "worker_type"]}),
    ("Credentials and labels", {"fields": ["api_key", "labels"]}),
    ("Scheduling hints", {"fields": ["priority", "cost"]}),
    ("Prefill/decode disaggregation and data parallelism", {
        "fields": ["pairing_protocol", "bootstrap_port", ("kv_connector", "kv_engine_id"), "dp_size",
                   "zmq_handshake_address"],
        "description": "Optional: a prefill, decode or encode worker's KV fields, and an ipc:// (ZMQ) engine's "
                       "data-parallel size and handshake address. Checked as POST /workers checks them.",
    }),
]
# action: (domain function, message to the operator, audit-log entry)
_ACTIONS = {
    "drain": (drain_worker, "Draining {url}: no new requests are sent to it.", "Drained from the console."),
    "remove": (remove_worker, "Removal of {url} queued (a ready worker drains first).", "Removal queued from the console."),
    "reregister": (reregister_worker, "Registration of {url} queued again.", "Registration re-run from the console."),
}


if TYPE_CHECKING:
    _WorkerModelAdmin = admin.ModelAdmin[Worker]
else:  # ModelAdmin is generic only in django-stubs
    _WorkerModelAdmin = admin.ModelAdmin


def _badge(kind: str, value: str, label: str) -> SafeString:
    return format_html('<span class="gw-badge gw-{}-{}">{}</span>', kind, value or "none", label)


@admin.register(Worker)
class WorkerAdmin(_WorkerModelAdmin):
    list_display = [
        "worker_url",
        "status_badge",
        "is_healthy",
        "model_column",
        "runtime",
        "type_column",
        "transport_column",
        "pairing_column",
        "dp_column",
        "source_column",
        "load",
        "breaker",
        "job",
    ]
    list_display_links = ["worker_url"]
    list_filter = ["status", "runtime_type", "worker_type", "source"]
    search_fields = ["url", "model_id"]
    search_help_text = "Search by URL or model id."
    actions = ["drain_selected", "remove_selected", "reregister_selected"]
    empty_value_display = _EMPTY
    readonly_fields = [
        "worker_url",
        "status_badge",
        "is_healthy",
        "model_column",
        "runtime_type",
        "worker_type",
        "connection_mode_column",
        "source",
        "registered",
        "pairing_column",
        "bootstrap_port_column",
        "kv_connector_column",
        "kv_engine_id_column",
        "dp_size_column",
        "handshake_column",
        "pd_partners",
        "dp_ranks_column",
        "priority",
        "cost",
        "load",
        "breaker",
        "job",
        "last_error",
        "spec_json",
        "created_at",
        "updated_at",
    ]
    fieldsets = [
        (None, {"fields": ["worker_url", ("status_badge", "is_healthy"), "model_column", ("runtime_type", "worker_type"),
                           ("connection_mode_column", "source"), "registered", ("priority", "cost")]}),
        ("Role, pairing and data parallelism", {"fields": [
            "pairing_column", "bootstrap_port_column", ("kv_connector_column", "kv_engine_id_column"),
            ("dp_size_column", "handshake_column"), "pd_partners",
        ]}),
        ("Live state (this gateway process)", {"fields": [("load", "breaker"), "dp_ranks_column"]}),
        ("Job", {"fields": ["job", "last_error"]}),
        ("Stored spec", {
            "fields": ["spec_json"],
            "description": "Read-only here: change it with PATCH or PUT /workers/{id} (the api_key is write-only "
                           "and never shown).",
        }),
        ("Timestamps", {"fields": [("created_at", "updated_at")], "classes": ["collapse"]}),
    ]

    # --- permissions: the spec is read-only here; removal is the Remove action, never a row delete --

    def has_change_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        return False

    def has_manage_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        """Drain, remove and re-register: what the model's change permission grants."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    # --- columns -------------------------------------------------------------------------------------

    @admin.display(description="URL", ordering="url")
    def worker_url(self, worker: Worker) -> str:
        return worker.url

    @admin.display(description="Status", ordering="status")
    def status_badge(self, worker: Worker) -> SafeString:
        return _badge("status", worker.status, worker.get_status_display())

    @admin.display(description="Healthy", boolean=True)
    def is_healthy(self, worker: Worker) -> bool:
        return worker.status == WorkerStatus.READY

    @admin.display(description="Model", ordering="model_id")
    def model_column(self, worker: Worker) -> SafeString | str:
        if not worker.model_id:
            return _EMPTY
        return format_html('<span class="gw-model" title="{}">{}</span>', worker.model_id, worker.model_id)

    @admin.display(description="DataPlane", ordering="runtime_type")
    def runtime(self, worker: Worker) -> SafeString:
        return format_html('<span title="{}">{}</span>', worker.get_runtime_type_display(), worker.runtime_type)

    @admin.display(description="Connection mode")
    def connection_mode_column(self, worker: Worker) -> str:
        return worker.transport.value

    @admin.display(description="Role", ordering="worker_type")
    def type_column(self, worker: Worker) -> SafeString:
        return _badge("role", worker.worker_type, worker.worker_type)

    @admin.display(description="Transport")
    def transport_column(self, worker: Worker) -> str:
        return worker.transport.value.upper()  # HTTP, GRPC, ZMQ

    @admin.display(description="Pairing")
    def pairing_column(self, worker: Worker) -> SafeString | str:
        """The pd_pairing key (prefill and decode), with the bootstrap port of a prefill worker."""
        pairing = pd_pairing_of(worker)
        port = worker.setting("bootstrap_port")
        if pairing is None:
            return format_html('<span class="gw-port">bootstrap {}</span>', port) if port else _EMPTY
        suffix = format_html(' <span class="gw-port">bootstrap {}</span>', port) if port else ""
        return format_html('<code class="gw-pairing">{}</code>{}', pairing, suffix)

    @admin.display(description="DP")
    def dp_column(self, worker: Worker) -> SafeString | str:
        """dp_size, and how many data-parallel ranks the load monitor last reported."""
        size = worker.setting("dp_size")
        ranks = len(live_state(worker).engine_load or ())
        if not size and not ranks:
            return _EMPTY
        shown = str(size) if size else "—"
        return format_html('<span title="dp_size; ranks in the last load report: {}">{}{}</span>', ranks, shown,
                           format_html(" · {} ranks", ranks) if ranks else "")

    @admin.display(description="Bootstrap port")
    def bootstrap_port_column(self, worker: Worker) -> str:
        port = worker.setting("bootstrap_port")
        return str(port) if port else _EMPTY

    @admin.display(description="KV connector")
    def kv_connector_column(self, worker: Worker) -> str:
        return kv_field(worker, "kv_connector") or _EMPTY

    @admin.display(description="KV engine id")
    def kv_engine_id_column(self, worker: Worker) -> str:
        return kv_field(worker, "kv_engine_id") or _EMPTY

    @admin.display(description="DP size")
    def dp_size_column(self, worker: Worker) -> str:
        size = worker.setting("dp_size")
        return str(size) if size else _EMPTY

    @admin.display(description="ZMQ handshake address")
    def handshake_column(self, worker: Worker) -> str:
        return handshake_address_of(worker) or _EMPTY

    @admin.display(description="Pairs with")
    def pd_partners(self, worker: Worker) -> SafeString | str:
        """The other side's workers of this worker's PD group (same model, same pairing key)."""
        if worker.worker_type not in (WorkerType.PREFILL, WorkerType.DECODE):
            return _EMPTY
        group = next((g for g in pd_groups(Worker.objects.filter(model_id=worker.model_id))
                      if worker in g.prefill or worker in g.decode), None)
        if group is None:
            return _EMPTY
        others = group.decode if worker.worker_type == WorkerType.PREFILL else group.prefill
        if not others:
            side = "decode" if worker.worker_type == WorkerType.PREFILL else "prefill"
            return format_html('<span class="gw-pd-unpaired">no {} worker with this pairing key</span>', side)
        items = format_html_join(
            "", '<li><a href="{}">{}</a> {}</li>',
            ((reverse("admin:administration_worker_change", args=[other.pk]), other.url,
              _badge("status", other.status, other.get_status_display())) for other in others),
        )
        return format_html('<ul class="gw-pd-partners">{}</ul>', items)

    @admin.display(description="Engine load per dp rank")
    def dp_ranks_column(self, worker: Worker) -> SafeString | str:
        ranks = dp_ranks(live_state(worker))
        if not ranks:
            return _EMPTY
        rows = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}%</td></tr>",
            ((r["dp_rank"], r["running"], r["waiting"], round(r["token_usage"] * 100, 1)) for r in ranks),
        )
        return format_html(
            '<table class="gw-dp-ranks"><thead><tr><th>dp rank</th><th>running</th><th>waiting</th>'
            "<th>KV usage</th></tr></thead><tbody>{}</tbody></table>", rows,
        )

    @admin.display(description="Source", ordering="source")
    def source_column(self, worker: Worker) -> SafeString:
        return format_html('<span title="{}">{}</span>', worker.get_source_display(), worker.source.upper())

    @admin.display(description="Load")
    def load(self, worker: Worker) -> SafeString | str:
        live = live_state(worker)
        if live.load is None:
            return _EMPTY
        return format_html('<span title="requests in flight from this gateway process">{}</span>', live.load)

    @admin.display(description="Circuit breaker")
    def breaker(self, worker: Worker) -> SafeString | str:
        live = live_state(worker)
        if live.breaker_state is None:
            return _EMPTY
        return _badge("breaker", live.breaker_state, live.breaker_state.replace("_", "-"))

    @admin.display(description="Job")
    def job(self, worker: Worker) -> SafeString | str:
        summary = job_summary(worker)
        if summary is None:
            return _EMPTY
        message = (
            format_html('<div class="gw-job-message" title="{}">{}</div>', summary.message, summary.message)
            if summary.message
            else ""
        )
        return format_html(
            '<span class="gw-job-type">{}</span> {} <span class="gw-job-age">{}</span>{}',
            summary.job_type,
            _badge("job", summary.state, summary.state),
            summary.age,
            message,
        )

    @admin.display(description="Spec (JSON)")
    def spec_json(self, worker: Worker) -> SafeString:
        return format_html('<pre class="gw-spec">{}</pre>', json.dumps(stored_spec(worker), indent=2, sort_keys=True))

    # --- add: the form parses a spec, create_worker queues the registration job ----------------------

    @method_decorator(sensitive_post_parameters("api_key"))
    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = WorkerAddForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid() and form.spec is not None:
            try:
                worker = create_worker(form.spec)
            except WorkerError as exc:
                form.add_error("url" if exc.status == 409 else None, str(exc))
            else:
                self.log_addition(request, worker, [{"added": {}}])
                self.message_user(request, f"Worker {worker.url} added; its registration job is queued.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:administration_worker_changelist"))
        # The admin's form helpers take any Form; django-stubs types them for ModelForm only.
        admin_form = helpers.AdminForm(cast(Any, form), cast(Any, _ADD_FIELDSETS), {}, model_admin=self)
        context = {
            **self.admin_site.each_context(request),
            "title": "Add worker",
            "subtitle": None,
            "adminform": admin_form,
            "object_id": None,
            "original": None,
            "is_popup": False,
            "to_field": None,
            "media": self.media + admin_form.media,
            "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(cast(Any, form), []),
            "preserved_filters": self.get_preserved_filters(request),
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            **(extra_context or {}),
        }
        return self.render_change_form(request, context, add=True, form_url=form_url)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"can_manage": self.has_manage_permission(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # The list is a wide table next to the filters: it gets the page width (breadcrumbs navigate).
        context = {"refresh_seconds": 5, "is_nav_sidebar_enabled": False, **(extra_context or {})}
        response = super().changelist_view(request, context)
        changelist = getattr(response, "context_data", None) and response.context_data.get("cl")  # type: ignore[attr-defined]
        if changelist is not None:  # the PD pairs of the workers the filters and search select
            response.context_data["pd_groups"] = _pd_group_rows(changelist.queryset)  # type: ignore[attr-defined]
        return response

    # --- actions: on the list and as buttons on the detail page --------------------------------------

    def _run(self, request: HttpRequest, action: str, workers: list[Worker]) -> None:
        function, done, audit = _ACTIONS[action]
        for worker in workers:
            try:
                function(worker.pk)
            except WorkerError as exc:
                self.message_user(request, f"{worker.url}: {exc}", messages.ERROR)
                continue
            self.log_change(request, worker, audit)
            self.message_user(request, done.format(url=worker.url), messages.SUCCESS)

    @admin.action(description="Drain selected workers", permissions=["manage"])
    def drain_selected(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._run(request, "drain", list(queryset))

    @admin.action(description="Remove selected workers (drain, then remove)", permissions=["manage"])
    def remove_selected(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._run(request, "remove", list(queryset))

    @admin.action(description="Re-run registration of selected workers", permissions=["manage"])
    def reregister_selected(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._run(request, "reregister", list(queryset))

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        own = [
            path(
                f"<uuid:worker_id>/{action}/",
                self.admin_site.admin_view(self._action_view(action)),
                name="%s_%s_" % info + action,
            )
            for action in _ACTIONS
        ]
        return own + fleet_urls(self) + super().get_urls()

    def _action_view(self, action: str) -> Any:
        @require_POST
        def view(request: HttpRequest, worker_id: uuid.UUID) -> HttpResponse:
            if not self.has_manage_permission(request):
                raise PermissionDenied
            worker = Worker.objects.filter(pk=worker_id).first()
            if worker is None:
                self.message_user(request, f"Worker {worker_id} not found.", messages.ERROR)
            else:
                self._run(request, action, [worker])
            if action == "remove" or worker is None:
                return HttpResponseRedirect(reverse("admin:administration_worker_changelist"))
            return HttpResponseRedirect(reverse("admin:administration_worker_change", args=[worker.pk]))

        return view

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Worker | None = None,
    ) -> HttpResponse:
        context.setdefault("action_urls", {
            action: reverse(f"admin:administration_worker_{action}", args=[obj.pk]) for action in _ACTIONS
        } if obj is not None else {})
        return super().render_change_form(request, context, add, change, form_url, obj)


def _pd_group_rows(workers: QuerySet[Worker]) -> list[dict[str, Any]]:
    """The list page's PD pairs section: the prefill/decode groups of ``workers`` (one query)."""
    rows = []
    for group in pd_groups(workers.filter(worker_type__in=[WorkerType.PREFILL, WorkerType.DECODE])):
        rows.append({
            "model": group.model,
            "pairing": group.pairing,
            "paired": group.paired,
            "state": group.state,
            "sides": [
                (side, [(reverse("admin:administration_worker_change", args=[w.pk]), w.url, w.status,
                         w.get_status_display(), w.setting("bootstrap_port")) for w in workers])
                for side, workers in (("prefill", group.prefill), ("decode", group.decode))
            ],
        })
    return rows


# --- per-tenant rate limits: plain rows; each save or delete reaches every gateway process -----------

if TYPE_CHECKING:
    _TenantRateLimitModelAdmin = admin.ModelAdmin[TenantRateLimit]
else:  # ModelAdmin is generic only in django-stubs
    _TenantRateLimitModelAdmin = admin.ModelAdmin

_RATE_LIMIT_HELP = (
    "Requests per minute for every key of one tenant, one budget shared by all gateway processes "
    "(through Redis when REDIS_URL is set). A row here overrides the tenant's --tenant-rate-limit flag; "
    "--default-tenant-rate-limit still applies to tenants with neither a row nor a flag. 0 means unlimited, "
    "also when a default is set. Every gateway process applies a save or delete at once (a notice over the "
    "channel layer), at the latest on its 5 s refresh; the current minute's count carries on."
)


def _per_minute(limit: int) -> str:
    return str(limit) if limit > 0 else "unlimited"


@admin.register(TenantRateLimit)
class TenantRateLimitAdmin(_TenantRateLimitModelAdmin):
    list_display = ["tenant_id", "limit_column", "flag_column", "updated_at"]
    search_fields = ["tenant_id"]
    search_help_text = "Search by tenant id."
    readonly_fields = ["updated_at"]
    fieldsets = [(None, {"fields": ["tenant_id", "requests_per_minute", "updated_at"], "description": _RATE_LIMIT_HELP})]

    @admin.display(description="Requests per minute", ordering="requests_per_minute")
    def limit_column(self, row: TenantRateLimit) -> str:
        return _per_minute(row.requests_per_minute)

    @admin.display(description="Flags alone (this process)")
    def flag_column(self, row: TenantRateLimit) -> str:
        return _per_minute(flag_tenant_limit(current_config(), row.tenant_id))

    def save_model(self, request: HttpRequest, obj: TenantRateLimit, form: Any, change: bool) -> None:
        save_tenant_rate_limit(obj)

    def delete_model(self, request: HttpRequest, obj: TenantRateLimit) -> None:
        delete_tenant_rate_limits(TenantRateLimit.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TenantRateLimit]) -> None:
        delete_tenant_rate_limits(queryset)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"rate_limit_help": _RATE_LIMIT_HELP, **(extra_context or {})})


# --- per-tenant token budgets: plain rows, installed like the rate limits ---------------------------

if TYPE_CHECKING:
    _TenantBudgetModelAdmin = admin.ModelAdmin[TenantBudget]
else:
    _TenantBudgetModelAdmin = admin.ModelAdmin

_BUDGET_HELP = (
    "Tokens (prompt plus completion) every key of one tenant may use per UTC day or calendar month, one "
    "budget shared by all gateway processes (through Redis when REDIS_URL is set; else each process counts "
    "its own use). A tenant whose budget is used up gets 429 budget_exceeded until the period ends; requests "
    "already running finish. A row here overrides the tenant's --tenant-budget flag; --default-tenant-budget "
    "still applies to tenants with neither a row nor a flag. 0 means unlimited, also when a default is set. "
    "The shared key and open mode are never budgeted. Every gateway process applies a save or delete at once, "
    "at the latest on its 5 s refresh; the period's use counts on."
)


def _budget_text(tokens: int, period: str) -> str:
    return f"{tokens:,} tokens/{period}" if tokens > 0 else "unlimited"


@admin.register(TenantBudget)
class TenantBudgetAdmin(_TenantBudgetModelAdmin):
    list_display = ["tenant_id", "budget_column", "flag_column", "updated_at"]
    search_fields = ["tenant_id"]
    search_help_text = "Search by tenant id."
    readonly_fields = ["updated_at"]
    fieldsets = [(None, {"fields": ["tenant_id", "tokens", "period", "updated_at"], "description": _BUDGET_HELP})]

    @admin.display(description="Budget", ordering="tokens")
    def budget_column(self, row: TenantBudget) -> str:
        return _budget_text(row.tokens, row.period)

    @admin.display(description="Flags alone (this process)")
    def flag_column(self, row: TenantBudget) -> str:
        budget = flag_tenant_budget(current_config(), row.tenant_id)
        return _budget_text(budget.tokens, budget.period) if budget is not None else "unlimited"

    def save_model(self, request: HttpRequest, obj: TenantBudget, form: Any, change: bool) -> None:
        save_tenant_budget(obj)

    def delete_model(self, request: HttpRequest, obj: TenantBudget) -> None:
        delete_tenant_budgets(TenantBudget.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TenantBudget]) -> None:
        delete_tenant_budgets(queryset)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"budget_help": _BUDGET_HELP, **(extra_context or {})})


if TYPE_CHECKING:
    _TokenizerModelAdmin = admin.ModelAdmin[RegisteredTokenizer]
else:
    _TokenizerModelAdmin = admin.ModelAdmin

_TOKENIZER_HELP = (
    "Tokenizers added with POST /v1/tokenizers and their loads (pending, processing, completed, failed). "
    "Each gateway process loads a completed tokenizer when a request first needs it. A failed load is "
    "kept about five minutes. Deleting a row here removes the tokenizer as DELETE /v1/tokenizers/{id} does."
)


@admin.register(RegisteredTokenizer)
class RegisteredTokenizerAdmin(_TokenizerModelAdmin):
    """Read-only rows (adds go through the API, which validates and queues the load); delete removes."""

    list_display = ["name", "status_badge", "source", "vocab_size", "message", "updated_at"]
    list_filter = ["status"]
    search_fields = ["name", "source"]
    search_help_text = "Search by name or source."
    readonly_fields = ["id", "name", "source", "chat_template_path", "status", "message", "vocab_size", "location",
                       "created_at", "updated_at"]
    fieldsets = [(None, {"fields": [("name", "status"), "id", "source", "chat_template_path", "message",
                                    ("vocab_size", "location"), ("created_at", "updated_at")],
                         "description": _TOKENIZER_HELP})]
    empty_value_display = _EMPTY

    @admin.display(description="Status", ordering="status")
    def status_badge(self, row: RegisteredTokenizer) -> SafeString:
        return _badge("tokenizer", row.status, row.get_status_display())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: RegisteredTokenizer | None = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: RegisteredTokenizer) -> None:
        remove_tokenizer(str(obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RegisteredTokenizer]) -> None:
        for row in list(queryset):
            remove_tokenizer(str(row.pk))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        purge_expired_tokenizers()
        return super().changelist_view(request, extra_context)

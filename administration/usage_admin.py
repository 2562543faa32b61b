"""The console's usage side (issue 25, items 4 and 6): model prices, the request log, usage minutes,
and the usage page with its CSV exports. Registered on the admin site by administration/admin.py.

* Prices (:class:`ModelPriceAdmin`): a row is never changed. "New price" (also offered on each row,
  prefilled from it) adds a row in force now or from a chosen moment, never one in the past, so spend
  already counted never changes; only a price not yet in force may be deleted.
* The request log (:class:`RequestLogEntryAdmin`): read-only, filtered by time (date drill-down),
  status, outcome, tenant and model, searched by request id; "Export CSV" writes the rows the current
  filters select.
* The usage page (administration/usage_page.py) hangs off the usage minutes' admin.
"""

from __future__ import annotations

from datetime import datetime, timezone as dt_timezone
from typing import TYPE_CHECKING, Any, Iterator

from django import forms
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.core.validators import MinValueValidator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from administration.console_query import query_holds_nul
from administration.models import ModelPrice, RequestLogEntry, UsageMinute
from administration.usage_page import csv_response, usage_urls
from administration.usage_read import PRICE_MAX, add_price

__all__ = ["ModelPriceAdmin", "RequestLogEntryAdmin", "UsageMinuteAdmin", "LOG_COLUMNS"]

if TYPE_CHECKING:
    _PriceModelAdmin = admin.ModelAdmin[ModelPrice]
    _LogModelAdmin = admin.ModelAdmin[RequestLogEntry]
    _UsageModelAdmin = admin.ModelAdmin[UsageMinute]
else:  # ModelAdmin is generic only in django-stubs
    _PriceModelAdmin = _LogModelAdmin = _UsageModelAdmin = admin.ModelAdmin

_PRICE_HELP = (
    "Prices per million tokens. Spend of a minute = (prompt - cached) x input + cached x cached input + completion "
    "x output, at the price in force at that minute (the latest row from at or before it); a model without a price "
    "has spend 0. A change adds a row and never rewrites an old one, so spend already counted never changes: a new "
    "price takes effect now or at a later moment, never earlier."
)


def _refused_query(model_admin: Any) -> HttpResponseRedirect:
    """What the admin answers a lookup it cannot use: the unfiltered changelist, flagged as an error."""
    return HttpResponseRedirect(reverse(f"admin:{model_admin.opts.app_label}_{model_admin.opts.model_name}_changelist")
                                + "?e=1")


# --- prices ------------------------------------------------------------------------------------------


class NewPriceForm(forms.ModelForm):
    """A new price row: effective now when left empty, never in the past."""

    effective_from = forms.DateTimeField(
        required=False, label="Effective from (UTC)",
        help_text="Empty: now. A later moment schedules the price; an earlier one is refused (it would rewrite spend).",
        widget=forms.DateTimeInput(attrs={"placeholder": "2026-01-31 12:00", "class": "vTextField"}),
    )  # fmt: skip
    cached_input_per_million = forms.DecimalField(
        required=False, min_value=0, max_value=PRICE_MAX, decimal_places=6, max_digits=14,
        help_text="Empty: the input price.",
    )  # fmt: skip

    class Meta:
        model = ModelPrice
        fields = ["model", "input_per_million", "cached_input_per_million", "output_per_million", "effective_from"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("input_per_million", "output_per_million"):
            if name in self.fields:  # not on the read-only page of a stored row
                self.fields[name].validators.append(MinValueValidator(0))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        now = timezone.now()
        moment = data.get("effective_from")
        if moment is None:
            data["effective_from"] = now
        elif moment < now:
            self.add_error("effective_from", "This moment is past: a new price takes effect now or later.")
        if data.get("cached_input_per_million") is None and data.get("input_per_million") is not None:
            data["cached_input_per_million"] = data["input_per_million"]
        return data


@admin.register(ModelPrice)
class ModelPriceAdmin(_PriceModelAdmin):
    form = NewPriceForm
    list_display = ["model", "effective_from", "input_per_million", "cached_input_per_million", "output_per_million",
                    "state_column", "new_price_link"]
    list_filter = ["model"]
    search_fields = ["model"]
    search_help_text = "Search by model."
    date_hierarchy = "effective_from"
    readonly_fields = ["created_at"]
    fieldsets = [(None, {"fields": ["model", ("input_per_million", "cached_input_per_million", "output_per_million"),
                                    "effective_from"], "description": _PRICE_HELP})]

    @admin.display(description="State")
    def state_column(self, row: ModelPrice) -> str:
        now = timezone.now()
        if row.effective_from > now:
            return "scheduled"
        newer = ModelPrice.objects.filter(model=row.model, effective_from__gt=row.effective_from,
                                          effective_from__lte=now).exists()
        return "superseded" if newer else "in force"

    @admin.display(description="")
    def new_price_link(self, row: ModelPrice) -> SafeString:
        query = urlencode({"model": row.model, "input_per_million": str(row.input_per_million),
                           "cached_input_per_million": str(row.cached_input_per_million),
                           "output_per_million": str(row.output_per_million)})
        return format_html('<a href="{}?{}">New price…</a>', reverse("admin:administration_modelprice_add"), query)

    def has_change_permission(self, request: HttpRequest, obj: ModelPrice | None = None) -> bool:
        return False  # a price is never rewritten: a change is a new row

    def has_delete_permission(self, request: HttpRequest, obj: ModelPrice | None = None) -> bool:
        if obj is not None and obj.effective_from <= timezone.now():
            return False  # in force or past: it priced tokens already
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # one scheduled row at a time, from its page
        return actions

    def save_model(self, request: HttpRequest, obj: ModelPrice, form: Any, change: bool) -> None:
        add_price(obj)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"subtitle": None, "price_help": _PRICE_HELP, **(extra_context or {})})


# --- the request log ---------------------------------------------------------------------------------

LOG_COLUMNS = ["at", "request_id", "tenant", "model", "worker", "surface", "route", "status", "outcome", "error_code",
               "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "tokens_estimated",
               "latency_ms", "ttft_ms"]


@admin.register(RequestLogEntry)
class RequestLogEntryAdmin(_LogModelAdmin):
    """Read-only: the flush loop writes the log, retention prunes it."""

    list_display = ["at", "request_id", "tenant", "model", "status", "outcome", "error_code", "prompt_tokens",
                    "completion_tokens", "cached_tokens", "tokens_estimated", "latency_ms", "worker", "route"]
    list_filter = ["status", "outcome", "tenant", "model", "surface"]
    search_fields = ["=request_id"]
    search_help_text = "Search by request id (exact)."
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False  # no COUNT(*) over the whole log per page
    readonly_fields = LOG_COLUMNS
    fields = tuple(LOG_COLUMNS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: RequestLogEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: RequestLogEntry | None = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        export = path("export.csv", self.admin_site.admin_view(self.export_view), name=f"{info}_export")
        return [export, *super().get_urls()]

    def export_view(self, request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
        """The rows the changelist's current filters and search select, newest first, as CSV."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if query_holds_nul(request):
            return _refused_query(self)
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return _refused_query(self)
        rows: QuerySet[RequestLogEntry] = changelist.get_queryset(request).order_by("-at", "-id")

        def values() -> Iterator[list[Any]]:
            for row in rows.values_list(*LOG_COLUMNS).iterator(chunk_size=2000):
                yield [row[0].astimezone(dt_timezone.utc).isoformat(), *row[1:]]

        return csv_response(f"request-log-{datetime.now(dt_timezone.utc):%Y%m%d-%H%M%S}.csv", LOG_COLUMNS, values())

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        query = request.GET.urlencode()
        export = reverse("admin:administration_requestlogentry_export") + (f"?{query}" if query else "")
        return super().changelist_view(request, {"export_url": export, **(extra_context or {})})


# --- usage minutes and the usage page ----------------------------------------------------------------


@admin.register(UsageMinute)
class UsageMinuteAdmin(_UsageModelAdmin):
    """Read-only minutes (the flush loop sums into them); the usage page sums them up."""

    list_display = ["minute", "tenant", "model", "requests", "errors", "prompt_tokens", "completion_tokens",
                    "cached_tokens", "reasoning_tokens"]
    list_filter = ["tenant", "model"]
    date_hierarchy = "minute"
    show_full_result_count = False
    readonly_fields = ["minute", "tenant", "model", "requests", "errors", "prompt_tokens", "completion_tokens",
                       "cached_tokens", "reasoning_tokens"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: UsageMinute | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: UsageMinute | None = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        return usage_urls(self) + super().get_urls()

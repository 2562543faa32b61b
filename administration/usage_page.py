"""The console's usage page (issue 25, item 6): who used what, what it cost, and how much of each
budget is left.

``GET /admin/administration/usageminute/usage/`` with optional ``start``, ``end`` (UTC days, the
last 30 by default, at most ``--usage-max-range-days``), ``tenant`` and ``model``: tokens per day per
tenant and per model and spend per day per model as SVG line charts (drawn by
``administration/static/administration/usage.js`` from the page's JSON, no library, like the fleet
page), the top tenants and models, each budget with what is left in its current period, the prices in
force, the newest requests of the log, and the usage table (tenant, model, day) that
``usage/export.csv`` downloads with the same parameters. A parameter the rules refuse is shown as an
error above the default view, never a 500.

Everything comes from one grouped query (:func:`administration.usage_read.usage` by tenant, model and
day): the charts, tops and totals are sums of its rows.
"""

from __future__ import annotations

import csv
from datetime import date, datetime, timedelta, timezone as dt_timezone
from typing import TYPE_CHECKING, Any, Iterable, Iterator, TypedDict

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode

from administration.usage_read import (
    DEFAULT_RANGE_DAYS,
    LogQuery,
    UsageQuery,
    UsageQueryError,
    UsageRow,
    budget_standings,
    log_rows,
    parse_usage_query,
    prices_in_force,
    usage,
)
from common.config import current_config

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

    from administration.models import UsageMinute

__all__ = ["CHART_SERIES", "TOP", "Series", "ChartDict", "usage_charts", "top_rows", "usage_urls", "TABLE_COLUMNS",
           "csv_response", "page_query"]

CHART_SERIES = 8  # lines per chart: the largest ones, the rest summed as "other"
TOP = 10  # rows of the top tenants and top models tables
RECENT_REQUESTS = 20
PAGE_PARAMS = ("start", "end", "tenant", "model")
TABLE_COLUMNS = ["tenant", "model", "day", "requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens",
                 "spend"]
OTHER = "other"


class Series(TypedDict):
    label: str
    values: list[float]
    total: float


class ChartDict(TypedDict):
    days: list[str]
    series: list[Series]


def _tokens(row: UsageRow) -> int:
    return row["prompt_tokens"] + row["completion_tokens"]


def _days(start: date, end: date) -> list[str]:
    return [(start + timedelta(days=offset)).isoformat() for offset in range((end - start).days + 1)]


def usage_charts(rows: Iterable[UsageRow], start: date, end: date, by: str, value: str) -> ChartDict:
    """One line per ``by`` (tenant or model) over every day of the range: tokens (prompt plus
    completion) or spend; the largest :data:`CHART_SERIES` lines, the rest summed as "other"."""
    days = _days(start, end)
    index = {day: position for position, day in enumerate(days)}
    lines: dict[str, list[float]] = {}
    for row in rows:
        amount = float(_tokens(row)) if value == "tokens" else row["spend"]
        line = lines.setdefault(row[by], [0.0] * len(days))  # type: ignore[literal-required]
        line[index[row["day"]]] += amount
    ranked = sorted(lines.items(), key=lambda item: (-sum(item[1]), item[0]))
    series: list[Series] = [{"label": label, "values": values, "total": sum(values)}
                            for label, values in ranked[:CHART_SERIES]]
    if len(ranked) > CHART_SERIES:
        rest = [sum(values[position] for _, values in ranked[CHART_SERIES:]) for position in range(len(days))]
        series.append({"label": OTHER, "values": rest, "total": sum(rest)})
    return {"days": days, "series": series}


def top_rows(rows: Iterable[UsageRow], by: str) -> list[dict[str, Any]]:
    """Per ``by`` (tenant or model): requests, errors, tokens and spend, the most tokens first."""
    sums: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = row[by]  # type: ignore[literal-required]  # by: tenant or model
        entry = sums.setdefault(name, {"name": name, "requests": 0, "errors": 0, "prompt_tokens": 0,
                                       "completion_tokens": 0, "cached_tokens": 0, "spend": 0.0})
        for key in ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "spend"):
            entry[key] += row[key]
    for entry in sums.values():
        entry["tokens"] = entry["prompt_tokens"] + entry["completion_tokens"]
        entry["spend"] = round(entry["spend"], 6)
    return sorted(sums.values(), key=lambda entry: (-entry["tokens"], -entry["spend"], entry["name"]))[:TOP]


def _totals(rows: Iterable[UsageRow]) -> dict[str, Any]:
    totals: dict[str, Any] = {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0,
                              "cached_tokens": 0, "spend": 0.0}
    for row in rows:
        for key in totals:
            totals[key] += row[key]  # type: ignore[literal-required]
    totals["tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    totals["spend"] = round(totals["spend"], 6)
    return totals


class _Echo:
    """A file-like whose write returns the line (csv.writer into a streamed response)."""

    def write(self, value: str) -> str:
        return value


def csv_response(filename: str, header: list[str], rows: Iterator[list[Any]]) -> StreamingHttpResponse:
    """A streamed CSV download (rows written as they are read, never all held)."""
    writer = csv.writer(_Echo())

    def lines() -> Iterator[str]:
        yield writer.writerow(header)
        for row in rows:
            yield writer.writerow(row)

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def page_query(params: dict[str, str], today: date) -> tuple[UsageQuery, str | None]:
    """The page's query and the message of a parameter refused (then the default view)."""
    asked = {name: params[name] for name in PAGE_PARAMS if params.get(name)}
    max_days = current_config().usage_max_range_days
    try:
        found = parse_usage_query(asked, today=today, max_days=max_days)
    except UsageQueryError as refused:
        return parse_usage_query({}, today=today, max_days=max_days), str(refused)
    return UsageQuery(found.start, found.end, ("tenant", "model", "day"), found.tenant, found.model), None


def _table_query(query: UsageQuery) -> UsageQuery:
    return UsageQuery(query.start, query.end, ("tenant", "model", "day"), query.tenant, query.model)


def _recent_requests(query: UsageQuery) -> list[Any]:
    start = datetime(query.start.year, query.start.month, query.start.day, tzinfo=dt_timezone.utc)
    end = None
    if query.end < date.max:
        following = query.end + timedelta(days=1)
        end = datetime(following.year, following.month, following.day, tzinfo=dt_timezone.utc)
    rows = log_rows(LogQuery(start=start, end=end, tenant=query.tenant, model=query.model))
    return list(rows[:RECENT_REQUESTS])


def usage_urls(model_admin: ModelAdmin[UsageMinute]) -> list[URLPattern]:
    """The page and its CSV, as admin views of the usage minutes' admin (staff login, view permission)."""
    site = model_admin.admin_site
    info = f"{model_admin.opts.app_label}_{model_admin.opts.model_name}"

    def allowed(request: HttpRequest) -> None:
        if not model_admin.has_view_permission(request):
            raise PermissionDenied

    def params_of(request: HttpRequest) -> dict[str, str]:
        return {name: request.GET.get(name, "") for name in PAGE_PARAMS}

    def page(request: HttpRequest) -> HttpResponse:
        allowed(request)
        params = params_of(request)
        query, error = page_query(params, datetime.now(dt_timezone.utc).date())
        answer = usage(_table_query(query))
        rows = answer["data"]
        config = current_config()
        shown = {name: value for name, value in params.items() if value} if error is None else {}
        context = {
            **site.each_context(request),
            "title": "Usage",
            "subtitle": None,
            "opts": model_admin.opts,
            "query": query,
            "params": params,
            "error": error,
            "default_days": DEFAULT_RANGE_DAYS,
            "max_days": config.usage_max_range_days,
            "totals": _totals(rows),
            "charts": {
                "tenant_tokens": usage_charts(rows, query.start, query.end, "tenant", "tokens"),
                "model_tokens": usage_charts(rows, query.start, query.end, "model", "tokens"),
                "model_spend": usage_charts(rows, query.start, query.end, "model", "spend"),
            },
            "top_tenants": top_rows(rows, "tenant"),
            "top_models": top_rows(rows, "model"),
            "unpriced_models": answer["unpriced_models"],
            "budgets": budget_standings(config.default_tenant_budget, config.tenant_budgets),
            "prices": prices_in_force(),
            "recent": _recent_requests(query),
            "table": rows,
            "export_url": reverse(f"admin:{info}_usage_export") + ("?" + urlencode(shown) if shown else ""),
            "log_url": reverse("admin:administration_requestlogentry_changelist"),
            "log_export_url": reverse("admin:administration_requestlogentry_export"),
            "prices_url": reverse("admin:administration_modelprice_changelist"),
            "new_price_url": reverse("admin:administration_modelprice_add"),
            "is_nav_sidebar_enabled": False,
        }
        return TemplateResponse(request, "admin/administration/usageminute/usage.html", context)

    def export(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
        allowed(request)
        asked = {name: value for name, value in params_of(request).items() if value}
        try:
            found = parse_usage_query(asked, today=datetime.now(dt_timezone.utc).date(),
                                      max_days=current_config().usage_max_range_days)
        except UsageQueryError as refused:
            return HttpResponseBadRequest(str(refused), content_type="text/plain; charset=utf-8")
        rows = usage(_table_query(found))["data"]

        def values() -> Iterator[list[Any]]:
            for row in rows:
                yield [row[column] for column in TABLE_COLUMNS]  # type: ignore[literal-required]

        return csv_response(f"usage-{found.start}-{found.end}.csv", TABLE_COLUMNS, values())

    return [
        path("usage/", site.admin_view(page), name=f"{info}_usage"),
        path("usage/export.csv", site.admin_view(export), name=f"{info}_usage_export"),
    ]

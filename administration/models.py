"""Stored control-plane state. The data plane never queries these; it reads registry snapshots."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.validators import RegexValidator
from django.db import models

from inference.accounting import Outcome
from inference.routing.workers import (
    RuntimeType,
    Transport,
    WorkerKind,
    WorkerStatus,
    WorkerType,
    kind_of,
    transport_of,
)

__all__ = [
    "Worker", "WorkerStatus", "WorkerSource", "WorkerType", "JobType", "JobState", "TenantRateLimit", "RegistryChange",
    "TokenizerStatus", "RegisteredTokenizer", "UsageMinute", "RequestLogEntry", "ModelPrice", "TenantBudget",
    "BudgetPeriod",
]


class WorkerSource(models.TextChoices):
    CLI = "cli", "Command line (--worker-urls)"
    API = "api", "Admin API"


class JobType(models.TextChoices):
    ADD = "AddWorker", "Add worker"
    UPDATE = "UpdateWorker", "Update worker"
    REMOVE = "RemoveWorker", "Remove worker"


class JobState(models.TextChoices):
    NONE = "", "No job"
    PENDING = "pending", "Pending"
    PROCESSING = "processing", "Processing"
    FAILED = "failed", "Failed"


class WorkerQuerySet(models.QuerySet["Worker"]):
    def routable(self) -> WorkerQuerySet:
        return self.filter(status=WorkerStatus.READY, registered=True)

    def from_cli(self) -> WorkerQuerySet:
        return self.filter(source=WorkerSource.CLI)

    def listed(self) -> WorkerQuerySet:
        """What GET /workers shows: registered workers (not those whose first registration runs)."""
        return self.filter(registered=True)

    def registering(self) -> WorkerQuerySet:
        """Workers whose first registration job runs (probing a worker not up yet): the console, GET
        /workers' ``registering`` and list_workers show them; nothing routes to them."""
        return self.filter(registered=False)


class Worker(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    url = models.CharField(max_length=2048, unique=True)
    runtime_type = models.CharField(max_length=32, choices=RuntimeType.choices, default=RuntimeType.UNSPECIFIED)
    worker_type = models.CharField(max_length=16, choices=WorkerType.choices, default=WorkerType.REGULAR)
    connection_mode = models.CharField(max_length=8, default="http")
    model_id = models.CharField(max_length=512, blank=True, default="")
    model_cards = models.JSONField(default=list, blank=True)  # the spec's "models" field
    labels = models.JSONField(default=dict, blank=True)  # discovered labels merged under the operator's
    # An external provider's model ids, from its /v1/models at registration (routed to it; not listed
    # by GET /v1/models, which lists self-hosted models).
    provider_models = models.JSONField(default=list, blank=True)
    priority = models.IntegerField(default=50)
    cost = models.FloatField(default=1.0)
    # The rest of the spec as given: dp_size, zmq_handshake_address, bootstrap_port, kv_connector,
    # kv_engine_id and the partial blocks health, overload, http_pool, resilience.
    settings = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.PENDING)
    source = models.CharField(max_length=8, choices=WorkerSource.choices, default=WorkerSource.API)
    # False while the first registration job runs: such workers are not listed or routed.
    registered = models.BooleanField(default=False)
    # Write-only: the key the gateway presents to this worker. Never rendered by any read path.
    api_key = models.CharField(max_length=512, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    # The latest job on this worker (spec: job_status); generation tells a stale job from the latest.
    job_type = models.CharField(max_length=16, choices=JobType.choices, blank=True, default="")
    job_state = models.CharField(max_length=16, choices=JobState.choices, blank=True, default="")
    job_message = models.TextField(blank=True, default="")
    job_updated_at = models.DateTimeField(null=True, blank=True)
    job_generation = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "url"]
        indexes = [models.Index(fields=["registered", "status"])]

    def __str__(self) -> str:
        return f"{self.url} ({self.status})"

    @property
    def transport(self) -> Transport:
        """How the gateway talks to the worker, named by its URL's scheme (http, grpc or zmq): the
        connection mode the console and the API show. The ``connection_mode`` column keeps what a
        request gave in the spec's older form, which does not decide anything."""
        return transport_of(self.url)

    @property
    def kind(self) -> WorkerKind:
        """What the gateway is to the worker (relays to it, serves it as an engine, or calls a
        provider's API), from its URL and runtime (inference/routing/workers.py)."""
        return kind_of(self.url, self.runtime_type)

    def setting(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)

    def model_ids(self) -> list[str]:
        """The canonical model id and every alias the worker's cards declare."""
        ids = [self.model_id] if self.model_id else []
        for card in self.model_cards:
            ids.extend([card.get("id", ""), *card.get("aliases", [])])
        return [model for model in dict.fromkeys(ids) if model]


TENANT_ID_VALIDATOR = RegexValidator(
    r"^[^\s:=]+\Z",
    "A tenant id is the part before ':' in --tenant-api-key TENANT:KEY: no spaces, ':' or '='.",
)


class TenantRateLimit(models.Model):
    """Requests per minute for one tenant's keys, set in the admin console. The gateway processes load
    these rows in their fleet loop (never per request): a row overrides the tenant's
    --tenant-rate-limit flag, and --default-tenant-rate-limit covers tenants with neither."""

    tenant_id = models.CharField(
        max_length=255,
        unique=True,
        validators=[TENANT_ID_VALIDATOR],
        help_text="The tenant of --tenant-api-key TENANT:KEY (every key of that tenant shares the budget).",
    )
    requests_per_minute = models.PositiveIntegerField(
        help_text="Requests per minute for this tenant across all gateway processes; 0 means unlimited "
        "(also when --default-tenant-rate-limit is set)."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id"]
        verbose_name = "tenant rate limit"

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.requests_per_minute or 'unlimited'} req/min"


class UsageMinute(models.Model):
    """What one tenant (or the shared key's or open mode's scope, :data:`inference.accounting.SHARED_SCOPE`
    and ``OPEN_SCOPE``) used of one canonical model in one UTC minute. Every gateway process adds its own
    in-memory sums to the row in one bulk upsert per flush interval, so the processes and hosts of one
    store sum into the same row; nothing writes it on a request's path."""

    tenant = models.CharField(max_length=255)
    model = models.CharField(max_length=255)
    minute = models.DateTimeField(help_text="The UTC minute, seconds zero.")
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0, help_text="Requests whose outcome was not success.")
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["minute", "tenant", "model"], name="usage_minute_key")]
        indexes = [
            models.Index(fields=["tenant", "minute"], name="usage_tenant_minute"),
            models.Index(fields=["model", "minute"], name="usage_model_minute"),
        ]
        ordering = ["-minute", "tenant", "model"]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.tenant} {self.model}: {self.requests} requests"


class RequestLogEntry(models.Model):
    """One inference request as an operator searches for it: never a body, a header or a key. Written
    in the flush batches; the newest --request-log-max-rows are kept."""

    at = models.DateTimeField(help_text="When the request arrived (UTC).")
    request_id = models.CharField(max_length=128)
    tenant = models.CharField(max_length=255)
    model = models.CharField(max_length=255)
    worker = models.CharField(max_length=512, blank=True, help_text="The URL of the worker that answered.")
    surface = models.CharField(max_length=32)
    route = models.CharField(max_length=128)
    status = models.PositiveSmallIntegerField()
    outcome = models.CharField(max_length=16, choices=[(outcome.value, outcome.label) for outcome in Outcome])
    error_code = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    tokens_estimated = models.BooleanField(
        default=False,
        help_text="The tokens are the gateway's estimate: a relayed stream that ended before its worker reported "
        "usage (the client left, the worker broke off) or that reported none.",
    )
    latency_ms = models.FloatField()
    ttft_ms = models.FloatField(null=True, blank=True, help_text="Time to the first token, when streamed.")

    class Meta:
        indexes = [
            models.Index(fields=["at"], name="reqlog_at"),
            models.Index(fields=["request_id"], name="reqlog_request_id"),
            models.Index(fields=["tenant", "at"], name="reqlog_tenant_at"),
            # None on (model, at) (D85): each index is about 7.5k instructions of a row's insert on
            # SQLite; a model filter walks reqlog_at instead, over a log bounded by --request-log-max-rows.
        ]
        ordering = ["-at", "-id"]
        verbose_name = "request log entry"
        verbose_name_plural = "request log"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.request_id} {self.status}"


class ModelPrice(models.Model):
    """A model's price from ``effective_from`` on, per million tokens. A change adds a row: spend is
    counted with the price in force when the tokens were used, so history is never rewritten."""

    model = models.CharField(max_length=255, help_text="The canonical model id.")
    effective_from = models.DateTimeField()
    input_per_million = models.DecimalField(max_digits=14, decimal_places=6)
    cached_input_per_million = models.DecimalField(max_digits=14, decimal_places=6)
    output_per_million = models.DecimalField(max_digits=14, decimal_places=6)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "effective_from"], name="model_price_key")]
        ordering = ["model", "-effective_from"]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from:%Y-%m-%d %H:%M}"


class BudgetPeriod(models.TextChoices):
    DAY = "day", "UTC day"
    MONTH = "month", "Calendar month (UTC)"


class TenantBudget(models.Model):
    """Tokens (prompt plus completion) one tenant may use per UTC day or calendar month, set in the
    console. Loaded by the fleet loop like tenant rate limits: a row overrides --tenant-budget, and
    --default-tenant-budget covers tenants with neither."""

    tenant_id = models.CharField(
        max_length=255,
        unique=True,
        validators=[TENANT_ID_VALIDATOR],
        help_text="The tenant of --tenant-api-key TENANT:KEY (every key of that tenant shares the budget).",
    )
    tokens = models.PositiveBigIntegerField(help_text="Tokens per period; 0 means unlimited.")
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices, default=BudgetPeriod.DAY)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id"]
        verbose_name = "tenant token budget"

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.tokens or 'unlimited'} tokens/{self.period}"


class RegistryChange(models.Model):
    """One committed registry change: a worker registered, updated, moved status or removed
    (``worker_id``), or something that is not one worker's, such as tenant limits (no worker id). The
    sequence number only goes up; every gateway process reads the changes past the last one it
    applied twice a second and re-reads just those workers, so a change made in any process (API,
    console, command, Celery job, another gateway on the store) reaches them all within about a
    second, with or without Redis. The host's leader deletes changes older than a few minutes. Never
    read on a request's path."""

    seq = models.BigAutoField(primary_key=True)
    worker_id = models.UUIDField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = "registry change"


class TokenizerStatus(models.TextChoices):
    """Spec 3, Tokenizer loading status."""

    PENDING = "pending", "Pending (queued)"
    PROCESSING = "processing", "Processing (loading)"
    COMPLETED = "completed", "Completed (ready)"
    FAILED = "failed", "Failed"


class RegisteredTokenizer(models.Model):
    """A tokenizer added through POST /v1/tokenizers, and its load job's state (the job is the row,
    as for workers). A name is held by one row that has not failed; a failed row is kept about five
    minutes for its status, then goes. ``location`` is the local path the job loaded it from (for a
    hub id or a gRPC worker, where the files were fetched to on the job's host). Gateway processes
    read completed rows in their fleet loop, never per request."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=255)
    source = models.CharField(max_length=2048, help_text="Model hub id, local path, or grpc://worker")
    chat_template_path = models.CharField(max_length=2048, blank=True, default="")
    status = models.CharField(max_length=16, choices=TokenizerStatus.choices, default=TokenizerStatus.PENDING)
    message = models.TextField(blank=True, default="")
    vocab_size = models.PositiveIntegerField(null=True, blank=True)
    location = models.CharField(max_length=4096, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["name", "created_at"]
        verbose_name = "tokenizer"
        constraints = [
            models.UniqueConstraint(
                fields=["name"], condition=~models.Q(status="failed"), name="tokenizer_name_unique_unless_failed"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

"""Stored control-plane state. The data plane never queries these; it reads registry snapshots."""

from __future__ import annotations

import uuid

from django.db import models

from administration.runtime import RuntimeType

__all__ = ["Worker", "WorkerStatus", "WorkerSource", "WorkerType"]


class WorkerStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    READY = "ready", "Ready"
    NOT_READY = "not_ready", "Not ready"
    DRAINING = "draining", "Draining"
    FAILED = "failed", "Failed"


class WorkerType(models.TextChoices):
    REGULAR = "regular", "Regular"
    PREFILL = "prefill", "Prefill"
    DECODE = "decode", "Decode"
    ENCODE = "encode", "Encode"


class WorkerSource(models.TextChoices):
    CLI = "cli", "Command line (--worker-urls)"
    API = "api", "Admin API"


class WorkerQuerySet(models.QuerySet["Worker"]):
    def routable(self) -> WorkerQuerySet:
        return self.filter(status=WorkerStatus.READY)

    def from_cli(self) -> WorkerQuerySet:
        return self.filter(source=WorkerSource.CLI)


class Worker(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    url = models.CharField(max_length=2048, unique=True)
    runtime_type = models.CharField(
        max_length=32, choices=RuntimeType.choices, default=RuntimeType.UNSPECIFIED
    )
    worker_type = models.CharField(max_length=16, choices=WorkerType.choices, default=WorkerType.REGULAR)
    model_id = models.CharField(max_length=512, blank=True, default="")
    model_cards = models.JSONField(default=list, blank=True)  # the spec's "models" field
    labels = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=50)
    cost = models.FloatField(default=1.0)
    status = models.CharField(max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.PENDING)
    source = models.CharField(max_length=8, choices=WorkerSource.choices, default=WorkerSource.API)
    # Write-only: the key the gateway presents to this worker. Never rendered by any read path.
    api_key = models.CharField(max_length=512, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "url"]

    def __str__(self) -> str:
        return f"{self.url} ({self.status})"

"""The store's settings from DATABASE_URL: a Postgres pool that checks its connections and neither
waits for one nor connects for long, so a store outage is a quick 503 rather than a 30 s wait."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from common.envconf import CONNECT_TIMEOUT_SECS, POOL_TIMEOUT_SECS, database_from_url


def test_a_postgres_pool_checks_connections_and_waits_briefly() -> None:
    entry = database_from_url("postgres://gw:pw@db.internal:5433/gateway", base_dir=Path("/srv"))
    assert entry["CONN_HEALTH_CHECKS"] is True and entry["CONN_MAX_AGE"] == 0
    assert entry["OPTIONS"] == {
        "pool": {"min_size": 1, "max_size": 10, "timeout": POOL_TIMEOUT_SECS},
        "connect_timeout": CONNECT_TIMEOUT_SECS,
    }
    assert POOL_TIMEOUT_SECS <= 5 and CONNECT_TIMEOUT_SECS <= 5


def test_the_url_can_change_the_timeouts_and_pass_libpq_parameters() -> None:
    entry = database_from_url("postgres://gw@db/gateway?pool_timeout=1.5&connect_timeout=7&sslmode=require",
                              base_dir=Path("/srv"))
    assert entry["OPTIONS"]["pool"]["timeout"] == 1.5
    assert entry["OPTIONS"]["connect_timeout"] == "7" and entry["OPTIONS"]["sslmode"] == "require"
    assert "pool_timeout" not in entry["OPTIONS"]


@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_a_pool_timeout_that_is_not_a_positive_number_fails_loudly(value: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="pool_timeout"):
        database_from_url(f"postgres://gw@db/gateway?pool_timeout={value}", base_dir=Path("/srv"))

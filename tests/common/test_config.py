"""Flags and their environment variables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.config import ConfigError, GatewayConfig, parse_gateway_args

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_match_the_spec(monkeypatch) -> None:
    for name in ("GW_PORT", "GW_HOST", "GW_POLICY", "GW_WORKER_URLS", "GW_API_KEY", "GW_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    config = parse_gateway_args([])
    assert (config.host, config.port, config.policy) == ("0.0.0.0", 30000, "round_robin")
    assert config.request_timeout_secs == 1800 and config.server == "uvicorn"
    assert not config.auth_enabled


def test_every_flag_parses() -> None:
    config = parse_gateway_args(
        [
            "--host", "127.0.0.1", "--port", "8080",
            "--worker-urls", "http://a:1", "https://b:2/",
            "--api-key", "sk-shared",
            "--tenant-api-key", "acme:sk-a", "--tenant-api-key", "globex:sk:with:colons",
            "--model-alias", "fast=llama", "--policy", "least_load",
            "--request-timeout-secs", "30", "--max-payload-size", "1024", "--log-level", "debug",
            "--server", "daphne",
        ]
    )
    assert config.worker_urls == ("http://a:1", "https://b:2")
    assert config.tenant_api_keys == (("acme", "sk-a"), ("globex", "sk:with:colons"))
    assert config.model_aliases == (("fast", "llama"),)
    assert (config.policy, config.server, config.max_payload_size) == ("least_load", "daphne", 1024)


def test_flags_are_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("GW_PORT", "31111")
    monkeypatch.setenv("GW_WORKER_URLS", "http://a:1,http://b:2")
    monkeypatch.setenv("GW_TENANT_API_KEYS", "acme:k1 globex:k2")
    monkeypatch.setenv("GW_MODEL_ALIASES", "fast=llama")
    monkeypatch.setenv("GW_POLICY", "random")
    config = parse_gateway_args([])
    assert config.port == 31111 and config.policy == "random"
    assert config.worker_urls == ("http://a:1", "http://b:2")
    assert config.tenant_api_keys == (("acme", "k1"), ("globex", "k2"))


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "abc"],
        ["--port", "70000"],
        ["--policy", "fastest"],
        ["--worker-urls", "ftp://x"],
        ["--tenant-api-key", "nocolon"],
        ["--model-alias", "=model"],
        ["--request-timeout-secs", "-1"],
        ["--max-payload-size", "0"],
        ["--no-such-flag"],
    ],
)
def test_malformed_flags_are_rejected(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_gateway_args(argv)


def test_zmq_workers_take_several_serving_processes() -> None:
    """Each serving process is one of the engines' clients (D69): no longer refused."""
    config = parse_gateway_args(["--worker-urls", "ipc:///tmp/engine", "--workers", "2"])
    assert config.worker_urls == ("ipc:///tmp/engine",)


def test_malformed_env_value_is_rejected(monkeypatch) -> None:
    monkeypatch.setenv("GW_TENANT_API_KEYS", "broken")
    with pytest.raises(ConfigError, match="GW_TENANT_API_KEYS"):
        parse_gateway_args([])


def test_config_round_trips_through_the_environment_form() -> None:
    config = parse_gateway_args(["--api-key", "k", "--tenant-api-key", "t:k2", "--model-alias", "a=b"])
    assert GatewayConfig.from_json(config.to_json()) == config


def test_repr_hides_keys() -> None:
    config = parse_gateway_args(["--api-key", "sk-very-secret", "--tenant-api-key", "t:sk-tenant-secret"])
    assert "sk-very-secret" not in repr(config) and "sk-tenant-secret" not in repr(config)


@pytest.mark.parametrize("argv", [["--bogus"], ["--port", "nope"], ["--policy", "x"]])
def test_rungateway_exits_with_a_clear_message(argv: list[str], tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "rungateway", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "GW_DATA_DIR": str(tmp_path)},
    )
    assert result.returncode != 0
    assert "error" in result.stderr.lower()
    assert "Traceback" not in result.stderr


def test_workers_take_a_number_or_auto() -> None:
    from common.config import usable_cores

    assert parse_gateway_args(["--workers", "3"]).workers == 3
    assert parse_gateway_args(["--workers", "auto"]).workers == usable_cores() >= 1
    assert parse_gateway_args([]).workers == 1 and parse_gateway_args([]).shutdown_grace_period_secs == 180
    for bad in ("0", "-1", "many"):
        with pytest.raises(ConfigError):
            parse_gateway_args(["--workers", bad])


def test_serving_processes_split_the_gateways_limits() -> None:
    config = parse_gateway_args([
        "--max-concurrent-requests", "5", "--queue-size", "3", "--multimodal-max-inflight-bytes", "1000",
    ])
    shares = [config.share(index, 2, shared_rate_counts=False) for index in range(2)]
    assert [s.max_concurrent_requests for s in shares] == [3, 2]  # together: the gateway's 5
    assert [s.queue_size for s in shares] == [2, 1]
    assert [s.multimodal_max_inflight_bytes for s in shares] == [500, 500]
    assert {s.media_request_limit for s in shares} == {1000}  # one request may still bring the whole budget
    assert {s.rate_limit_share for s in shares} == {2}
    assert config.share(0, 2, shared_rate_counts=True).rate_limit_share == 1  # Redis counts for all
    tiny = parse_gateway_args(["--max-concurrent-requests", "1"]).share(1, 4, shared_rate_counts=False)
    assert tiny.max_concurrent_requests == 1  # every process can serve
    assert parse_gateway_args([]).share(0, 4, shared_rate_counts=False).max_concurrent_requests == 0  # off stays off
    assert config.share(0, 1, shared_rate_counts=False) is config


def test_auto_workers_follow_a_cgroup_cpu_limit(tmp_path) -> None:
    """A container's CPU quota narrows the cores affinity shows (cgroup v2 cpu.max, v1 cfs quota)."""
    from common.config import cgroup_cpu_quota, usable_cores

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(v2) == 1.5 and usable_cores(v2) == min(2, usable_cores(tmp_path / "none"))
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(v2) is None and usable_cores(v2) == usable_cores(tmp_path / "none")
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_quota(v1) == 1.0 and usable_cores(v1) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_quota(v1) is None

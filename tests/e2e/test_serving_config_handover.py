"""``rungateway --workers N`` hands each serving process its configuration over an unnamed owner-only
file it reads and closes as it starts, never through the environment: no API key, whether given as
a flag or in a flag's environment variable, can be read in a serving process's /proc/<pid>/environ
(readable by any process of the same user), and each serving process still has every key."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_serving_processes import CHAT, pin_each, serving_pids, start_supervised  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e


def test_no_key_is_in_a_serving_process_environment_and_every_process_has_them(
    start_supervised, mock_worker_process  # noqa: F811
) -> None:
    gateway_key = f"sk-gateway-{uuid.uuid4().hex}"
    admin_key = f"sk-admin-{uuid.uuid4().hex}"
    gateway, port = start_supervised(
        "--worker-urls", mock_worker_process.url, "--control-plane-api-keys", f"ops:ops:admin:{admin_key}",
        env={"GW_API_KEY": gateway_key},
    )
    pids = serving_pids(gateway)
    assert len(pids) == 2
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert gateway_key.encode() not in environ and admin_key.encode() not in environ
        assert b"GW_CONFIG=" not in environ and b"GW_API_KEY=" not in environ
        # the handover file was closed once read: no descriptor of the process still reaches it
        targets = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir() if fd.exists()]
        assert not [target for target in targets if "(deleted)" in target], targets
    run_dir = Path(gateway.env["GW_DATA_DIR"]) / "run" / f"gateway-{port}"
    written = [path for path in run_dir.rglob("*") if path.is_file()]
    assert not [path for path in written if gateway_key.encode() in path.read_bytes()], written
    for pid, connection in pin_each(gateway, port, pids).items():  # each process has both keys
        assert connection.request("POST", "/v1/chat/completions", CHAT)[0] == 401, pid
        assert connection.request("POST", "/v1/chat/completions", CHAT, {"Authorization": f"Bearer {gateway_key}"})[0] == 200
        assert connection.request("GET", "/workers")[0] == 401, pid
        assert connection.request("GET", "/workers", None, {"Authorization": f"Bearer {admin_key}"})[0] == 200, pid

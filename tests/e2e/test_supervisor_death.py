"""A supervisor that dies without a word (SIGKILL) takes its serving processes with it: each asked the
kernel for SIGTERM on its parent's death as it started (PR_SET_PDEATHSIG), so none keeps serving
the port with nobody to replace or stop it. A serving process whose supervisor died before it made
that request sees another parent and exits at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT, wait_for
from tests.e2e.test_serving_processes import _dead, serving_pids, start_supervised  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e


def test_a_sigkilled_supervisor_takes_its_serving_processes_with_it(start_supervised, mock_worker_process) -> None:  # noqa: F811
    gateway, _port = start_supervised("--worker-urls", mock_worker_process.url)
    pids = serving_pids(gateway)
    assert len(pids) == 2
    try:
        os.kill(gateway.popen.pid, signal.SIGKILL)
        gateway.popen.wait(timeout=10)
        wait_for(lambda: all(_dead(pid) for pid in pids), 20, "every serving process gone with its supervisor", None)
    finally:
        for pid in pids:  # a failed run leaves nothing behind
            if not _dead(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_serving_process_whose_supervisor_already_died_exits_at_once() -> None:
    """The race the kernel's request cannot cover: the parent died before it was made. Here the
    supervisor named in the environment is not this process's parent."""
    code = "from administration.supervisor import end_with_supervisor; end_with_supervisor(); print('still here')"
    env = {**os.environ, "GW_SUPERVISOR_PID": str(2**22 + 1), "DJANGO_SETTINGS_MODULE": "gateway_project.settings"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "still here" not in done.stdout
    assert "the supervisor (pid 4194305) is gone" in done.stderr

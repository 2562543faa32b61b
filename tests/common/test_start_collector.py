"""The collector across a gateway's start (D118): paused by ``manage.py rungateway`` before the
first import, on again once the gateway started, with the start's objects frozen out of its passes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from common.start_collector import pause_for_start, resume_after_start

REPO = Path(__file__).resolve().parents[2]


def test_resuming_freezes_what_lives_sets_the_thresholds_and_turns_the_collector_on() -> None:
    before = gc.get_threshold()
    try:
        pause_for_start()
        assert not gc.isenabled()
        kept = [[index] for index in range(1000)]
        resume_after_start((12_345, 10, 10))
        assert gc.isenabled()
        assert gc.get_threshold() == (12_345, 10, 10)
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        gc.enable()


_PROBE = """
import gc, sys
sys.argv = ["manage.py", "rungateway", "--workers", "not-a-number"]
import manage
try:
    manage.main()
except SystemExit:
    pass
print("enabled" if gc.isenabled() else "paused")
"""


def test_manage_py_rungateway_pauses_the_collector_before_django_starts() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gateway_project.settings"}
    probe = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip().splitlines()[-1] == "paused", probe.stderr

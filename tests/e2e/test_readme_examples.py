"""The README's examples, run as written against ``make run``, ``make run-grpc`` and ``make run-zmq`` (the real make
targets, on free ports), print what the README shows (tests/readme_examples.py says how examples are
marked and compared)."""

from __future__ import annotations

import subprocess
import sys
from typing import Callable

import pytest

from tests.e2e.conftest import ROOT, Process, free_port
from tests.readme_examples import Example, examples, matches

pytestmark = [pytest.mark.e2e, pytest.mark.embedded]

TARGETS = ("run", "run-grpc", "run-zmq")


def test_the_readme_has_examples_for_both_targets_and_each_shows_its_output() -> None:
    found = examples()
    assert {example.target for example in found} == set(TARGETS)
    assert {example.lang for example in found} == {"sh", "python"}
    assert all(example.shown.strip() for example in found)
    texts = " ".join(example.code for example in found)
    for call in ("/v1/models", "/v1/chat/completions", "chat.completions.create", "responses.create", "previous_response_id"):
        assert call in texts


def _start(spawn: Callable[..., Process], target: str) -> Process:
    port, worker_port = free_port(), free_port()
    argv = [
        "make",
        "--no-print-directory",
        target,
        f"GW_PORT={port}",
        f"WORKER_PORT={worker_port}",
        f"ENGINE_PORT={worker_port}",
        f"ARGS=--host 127.0.0.1 --prometheus-port {free_port()}",
    ]
    return spawn(f"make-{target}", [], port, ready_path="/readiness", argv=argv, group=True)


def _run(example: Example, port: int) -> str:
    code = example.for_port(port)
    argv = ["bash", "-euo", "pipefail", "-c", code] if example.lang == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"README.md:{example.line} failed ({done.returncode}):\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_the_readme_examples_print_what_the_readme_shows(spawn: Callable[..., Process], target: str) -> None:
    gateway = _start(spawn, target)
    port = int(gateway.url.rsplit(":", 1)[1])
    ran = 0
    for example in examples():
        if example.target != target:
            continue
        printed = _run(example, port)
        assert matches(example.shown, printed), (
            f"README.md:{example.line} ({target}) printed:\n{printed}\nthe README shows:\n{example.shown}"
        )
        ran += 1
    assert ran >= 2

"""Facts about the machine and the tree that a result depends on (read-only: no state changes)."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["describe", "loadavg", "missing_tools"]


def _run(argv: list[str], cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=cwd, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def loadavg() -> str:
    """The 1/5/15-minute load averages, e.g. ``0.12 0.30 0.25``."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def missing_tools(tools: dict[str, str]) -> list[str]:
    """Names in ``tools`` (name -> path) that are not executable."""
    return [name for name, path in tools.items() if not os.access(path, os.X_OK)]


def describe(repo: Path, nginx: str, wrk: str) -> dict[str, Any]:
    commit = _run(["git", "rev-parse", "--short", "HEAD"], cwd=repo) or "unknown"
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo))
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nginx": _run([nginx, "-v"]).replace("nginx version: ", ""),
        "wrk": " ".join(_run([wrk, "--version"]).split()[:2]),
        "loadavg_start": loadavg(),
        "commit": commit,
        "dirty": dirty,
    }

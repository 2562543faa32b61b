"""The layers' rule that import-linter cannot see: no module of ours is imported inside a function
(an import deferred to dodge a cycle hides the cycle instead of breaking it). The layers themselves
are checked by ``make contracts`` (.importlinter)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "inference", "administration", "responses_api", "gateway_project", "standins")
# Deferred on purpose, not for a cycle: what only some processes use, imported where it is used, off
# every gateway's start (D118). Each is a module whose own imports are heavy and optional.
DEFERRED_FOR_START = {
    ("administration/jobs.py", "administration.tasks"): "Celery and kombu, for a gateway with a broker, at its first job sent",
    ("administration/servers.py", "administration.receipt_twisted"): "Twisted's web module, for a daphne process only",
}


def _deferred_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            found.extend(
                f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names if name.split(".")[0] in PACKAGES
            )
    return found


def test_no_module_of_ours_is_imported_inside_a_function() -> None:
    sources = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if "migrations" not in path.parts]
    assert len(sources) > 50
    deferred = [found for path in sources for found in _deferred_imports(path)]
    kept = {(found.split(":")[0], found.split(" ")[1]) for found in deferred}
    assert kept <= set(DEFERRED_FOR_START), sorted(kept - set(DEFERRED_FOR_START))
    assert len(deferred) == len(kept)  # one deferred import each

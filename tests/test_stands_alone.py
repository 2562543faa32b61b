"""The repository stands alone: nobody who clones it has this machine's folders or a ``shared/`` folder
beside the checkout, so no source, test, benchmark, Makefile or CI script may name a path outside it.
Fixtures live in ``fixtures/`` and are found through ``standins.fixtures``."""

from __future__ import annotations

import re
import subprocess

from standins.fixtures import FIXTURE_MODELS, FIXTURE_SPECS, REPOSITORY

# Written in pieces, so that this file does not itself hold the paths it looks for.
_MACHINE = "/" + "work" + "/"
_BESIDE = r"\.\./" + "shared"
OUTSIDE = re.compile(
    "|".join((re.escape(_MACHINE), _BESIDE, r"""parents\[\d+\]\s*/\s*["']shared["']""", r"""\.parent\s*/\s*["']shared["']"""))
)


def _tracked(*patterns: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *patterns], cwd=REPOSITORY, capture_output=True, text=True, check=True
    )
    return [line for line in listed.stdout.splitlines() if line]


def test_no_tracked_file_reaches_outside_the_checkout() -> None:
    files = _tracked("*.py", "Makefile", ".ci/*", "*.ini", "*.cfg", "*.toml", "*.sh")
    assert "manage.py" in files
    outside = [
        f"{name}:{number} {line.strip()}"
        for name in files
        for number, line in enumerate((REPOSITORY / name).read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert outside == []


def test_fixtures_are_in_the_repository_with_their_licences_and_sources() -> None:
    models = sorted(path.name for path in FIXTURE_MODELS.iterdir() if path.is_dir())
    assert {"qwen3", "llama3", "mistral", "deepseek-r1"} <= set(models)
    for name in models:
        folder = FIXTURE_MODELS / name
        assert (folder / "LICENSE").is_file() and (folder / "SOURCE.md").is_file(), name
        # every file of the folder checked in (a tokenizer folder's tokenizer_config.json, an image
        # processor's preprocessor_config.json alike)
        files = sorted(str(path.relative_to(REPOSITORY)) for path in folder.iterdir() if path.is_file())
        assert files and _tracked(*files) == files, f"{name} is not checked in"
    assert (FIXTURE_SPECS / "openai" / "openapi.yaml").is_file()

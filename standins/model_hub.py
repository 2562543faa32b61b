"""A stand-in model hub: huggingface_hub's ``snapshot_download`` served from local repositories.

``ModelHub(root)`` holds one folder per repository (``root/org/name``, its files at the top level);
:meth:`ModelHub.snapshot_download` takes the hub client's call as the gateway makes it
(``repo_id``, ``allow_patterns``) and does what the client does with it: the repository's files
chosen by ``allow_patterns`` with the client's own filter (``huggingface_hub.utils.filter_repo_objects``),
copied into a snapshot folder under ``cache``, whose path it returns. An unknown repository raises
the client's ``RepositoryNotFoundError``. ``downloads`` records each call's file names.
:meth:`ModelHub.file_sizes` is the hub's file listing (``model_info(files_metadata=True)``): each
file's size by name.

Tests put it in place of the client (``inference.pipeline.tokenizer_sources._snapshot_download`` and
``_hub_file_sizes``; :meth:`ModelHub.install` sets both on the module it is given).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.utils import filter_repo_objects

__all__ = ["ModelHub"]


class ModelHub:
    """Repositories under ``root`` (``root/org/name``), downloaded into ``cache``."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.root = root
        self.cache = cache
        self.downloads: list[list[str]] = []

    def repository(self, repo_id: str, files: dict[str, Path | bytes]) -> Path:
        """Add (or refill) a repository: each file a path to link to or its bytes."""
        folder = self.root / repo_id
        folder.mkdir(parents=True, exist_ok=True)
        for name, source in files.items():
            target = folder / name
            target.unlink(missing_ok=True)
            if isinstance(source, bytes):
                target.write_bytes(source)
            else:
                target.symlink_to(source)
        return folder

    def install(self, monkeypatch: Any, client: Any) -> None:
        """Put this hub in place of the hub client of ``client`` (the gateway's tokenizer-sources
        module, given by the test: stand-ins import nothing of the product) with a pytest ``monkeypatch``."""
        monkeypatch.setattr(client, "_snapshot_download", self.snapshot_download)
        monkeypatch.setattr(client, "_hub_file_sizes", self.file_sizes)

    def _folder(self, repo_id: str) -> Path:
        folder = self.root / repo_id
        if not folder.is_dir():
            request = httpx2.Request("GET", f"https://hub.invalid/api/models/{repo_id}")
            raise RepositoryNotFoundError(
                f"{repo_id} is not on the stand-in hub", response=httpx2.Response(404, request=request)
            )
        return folder

    def file_sizes(self, repo_id: str) -> dict[str, int]:
        folder = self._folder(repo_id)
        return {path.name: path.stat().st_size for path in folder.iterdir() if path.is_file()}

    def snapshot_download(
        self, repo_id: str, *, allow_patterns: list[str] | str | None = None, **_: Any
    ) -> str:
        folder = self._folder(repo_id)
        names = sorted(path.name for path in folder.iterdir() if path.is_file())
        chosen = list(filter_repo_objects(names, allow_patterns=allow_patterns))
        self.downloads.append(chosen)
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        snapshot = self.cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for name in chosen:
            shutil.copyfile(folder / name, snapshot / name)
        return str(snapshot)

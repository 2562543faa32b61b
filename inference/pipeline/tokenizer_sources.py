"""Where a tokenizer comes from, made into a local directory that :func:`load_tokenizer` reads.

A source (spec 3, the tokenizer registry's ``source``; also --tokenizer-path and --model-path) is
one of:

- a local directory holding tokenizer.json (and its tokenizer_config.json, chat template...), or
  the tokenizer.json file itself;
- a model-hub id (``org/name``): fetched by huggingface_hub's ``snapshot_download`` (its cache,
  ``HF_HOME`` / ``HF_HUB_CACHE``, and ``HF_HUB_OFFLINE`` for a host without the hub), only the
  tokenizer's files and the model's two small configs gRPC EPD reads (:data:`HUB_FILE_PATTERNS`; a
  file the repository lacks is no error), refused before anything is downloaded when those files
  come to more than :data:`MAX_ARCHIVE_BYTES` (the hub's file listing; not checked offline, where
  only the cache is read); without huggingface_hub, ``tokenizers``' own
  ``Tokenizer.from_pretrained`` (tokenizer.json alone), saved under ``work_dir``;
- a gRPC worker (``grpc://host:port``, ``grpcs://``): the engine's GetTokenizer stream, a zip in
  chunks checked against its sha256 (:meth:`EngineClient.tokenizer`), unpacked under ``work_dir``
  whole (the servicers' bundle holds config.json and preprocessor_config.json beside the tokenizer).

The directory this gives is the loaded tokenizer's ``path``, where gRPC EPD finds the model's image
processor too (:func:`inference.upstreams.epd_pixels.load_vision_processor`).

Everything here blocks (it runs in a job or on a loading thread, never on the event loop);
:func:`afetch_worker_tokenizer` is the async part for a caller that has a loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import shutil
import tempfile
import zipfile
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable

from tokenizers import Tokenizer

from inference.pipeline.tokenizers import TokenizerLoadError
from inference.upstreams import connect_engine
from inference.upstreams.engine import MAX_TOKENIZER_BYTES
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.registry import UnknownUpstream

_snapshot_download: Callable[..., Any] | None = None  # a stand-in for the hub client's (tests)
_hub_file_sizes: Callable[[str], dict[str, int] | None] | None = None  # and for its file listing (tests)


def _hub_snapshot_download() -> Callable[..., Any] | None:
    """The hub client's ``snapshot_download``, imported when a hub id is first fetched rather than at
    every start (issue 26 item 5); None without it (``tokenizers``' own download is used)."""
    try:  # the hub client comes with ``tokenizers``; without it, the library's own download
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - huggingface_hub is installed with tokenizers
        return None
    return snapshot_download


def _hub_listing(repo_id: str) -> dict[str, int] | None:
    """The sizes of a hub repository's files by name, from the hub's listing; None on a host set
    offline (``HF_HUB_OFFLINE``), where the download reads the cache alone."""
    if _hub_file_sizes is not None:
        return _hub_file_sizes(repo_id)
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        return None
    info = HfApi().model_info(repo_id, files_metadata=True)
    return {sibling.rfilename: sibling.size or 0 for sibling in info.siblings or ()}


def _check_hub_size(repo_id: str) -> None:
    """Refuse a repository whose files the gateway would fetch come to more than a tokenizer may
    take (:data:`MAX_ARCHIVE_BYTES`), before any is downloaded; the weights are never counted."""
    from huggingface_hub.utils import filter_repo_objects

    sizes = _hub_listing(repo_id)
    if sizes is None:
        return
    total = sum(sizes[name] for name in filter_repo_objects(list(sizes), allow_patterns=HUB_FILE_PATTERNS))
    if total > MAX_ARCHIVE_BYTES:
        raise TokenizerLoadError(
            f"its tokenizer files come to {total} bytes, more than the {MAX_ARCHIVE_BYTES} a tokenizer may take"
        )

__all__ = [
    "SourceKind", "source_kind", "resolve_tokenizer_source", "afetch_worker_tokenizer", "unpack_tokenizer_archive",
    "HUB_FILE_PATTERNS", "MAX_ARCHIVE_BYTES",
]  # fmt: skip

HUB_FILE_PATTERNS = [
    "tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json", "*.jinja",
    "config.json", "preprocessor_config.json",
]  # fmt: skip
"""What is fetched of a hub repository: the tokenizer and its templates, never the weights; and, as
the reference gateway fetches them for a hub model (smg's ``resolve_model_config_dir``), the model's
config.json (the image pad token's id) and preprocessor_config.json (the image processor gRPC EPD
runs), both a few KiB. A repository without them (a text model) downloads the rest as before."""

MAX_ARCHIVE_BYTES = MAX_TOKENIZER_BYTES
"""The most a worker's tokenizer archive may unpack to, and a hub repository's fetched files may
come to (a tokenizer is tens of MiB at most)."""

WORKER_FETCH_TIMEOUT_SECS = 120.0

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")
_WORKER_SCHEMES = ("grpc://", "grpcs://")


class SourceKind(StrEnum):
    LOCAL = "local"
    HUB = "hub"
    WORKER = "worker"


def source_kind(source: str) -> SourceKind:
    """A gRPC worker by its scheme; a path that exists (or is written as one) is local; else a
    model-hub id when it reads as one (``name`` or ``org/name``)."""
    if source.startswith(_WORKER_SCHEMES):
        return SourceKind.WORKER
    if source.startswith(("/", "./", "../", "~")) or Path(source).expanduser().exists():
        return SourceKind.LOCAL
    return SourceKind.HUB if _HUB_ID.match(source) else SourceKind.LOCAL


def _slug(text: str) -> str:
    """A directory name for a source (readable, and unique by a short digest)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:64].strip("_") or "source"
    return f"{readable}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def resolve_tokenizer_source(
    source: str,
    *,
    work_dir: str | os.PathLike[str],
    api_key: str | None = None,
    timeout: float = WORKER_FETCH_TIMEOUT_SECS,
) -> Path:
    """A local directory or file holding the tokenizer of ``source`` (fetched now when it is a hub
    id or a worker). Blocks; call it off the event loop. Raises :class:`TokenizerLoadError`."""
    kind = source_kind(source)
    if kind is SourceKind.LOCAL:
        return Path(source).expanduser()  # load_tokenizer says what is missing
    if kind is SourceKind.HUB:
        return _from_hub(source, Path(work_dir))
    destination = Path(work_dir) / "workers" / _slug(source)
    return asyncio.run(afetch_worker_tokenizer(source, destination, api_key=api_key, timeout=timeout))


def _from_hub(repo_id: str, work_dir: Path, download: Callable[..., Any] | None = None) -> Path:
    download = download or _snapshot_download or _hub_snapshot_download()
    try:
        if download is not None:
            _check_hub_size(repo_id)
            return Path(download(repo_id, allow_patterns=HUB_FILE_PATTERNS))
        destination = work_dir / "hub" / _slug(repo_id)
        tokenizer = Tokenizer.from_pretrained(repo_id)
        destination.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(destination / "tokenizer.json"))
        return destination
    except Exception as error:  # the hub client's errors (offline, not found, gated) have no common base
        raise TokenizerLoadError(f"cannot fetch {repo_id!r} from the model hub: {error}") from error


async def afetch_worker_tokenizer(
    url: str, destination: Path, *, api_key: str | None = None, timeout: float = WORKER_FETCH_TIMEOUT_SECS
) -> Path:
    """Fetch an engine worker's tokenizer (gRPC's GetTokenizer; the client checks the sha256) and
    unpack it into ``destination``. Raises :class:`TokenizerLoadError`."""
    try:
        async with asyncio.timeout(timeout):
            client = await connect_engine(url, api_key=api_key)
            try:
                bundle = await client.tokenizer()
            finally:
                await client.close()
    except (UpstreamFailure, UnknownUpstream) as error:
        raise TokenizerLoadError(f"cannot fetch the tokenizer of {url}: {error}") from error
    except TimeoutError:
        raise TokenizerLoadError(f"the tokenizer of {url} did not arrive within {timeout:g} s") from None
    await asyncio.to_thread(unpack_tokenizer_archive, bundle.data, destination)
    return destination


def unpack_tokenizer_archive(data: bytes, destination: Path) -> None:
    """Unpack a tokenizer zip into ``destination`` (replaced whole): plain files only, by their base
    name (no directories, no path climbing), at most :data:`MAX_ARCHIVE_BYTES` in all."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as error:
        raise TokenizerLoadError(f"the tokenizer archive is not a zip file: {error}") from None
    with archive:
        members = [info for info in archive.infolist() if not info.is_dir()]
        if sum(info.file_size for info in members) > MAX_ARCHIVE_BYTES:
            raise TokenizerLoadError(f"the tokenizer archive unpacks to more than {MAX_ARCHIVE_BYTES} bytes")
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=destination.parent))
        try:
            for info in members:
                name = os.path.basename(info.filename.replace("\\", "/"))
                if not name or name in (".", ".."):
                    continue
                with archive.open(info) as source, (staging / name).open("wb") as target:
                    shutil.copyfileobj(source, target)
            if destination.exists():
                shutil.rmtree(destination)
            os.replace(staging, destination)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

"""What a bundle is made from, as one digest: a run on unchanged data reuses the bundle an earlier run built.

The digest covers everything build_bundle reads: the bytes of every data file and every annotator's
user_state.json, the names and sizes and times of the files under the media folder (a bundle links them by
path, and one added or removed changes it), the parts of the config the build reads (schemes, item
properties, folders, aggregation, splits and their seed, include_unlabeled), the schemes the run trains,
and the builder's own format. Any change of one misses; nothing else does (a new max_wall_seconds, say).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from potato_queue.bundle.annotations import annotator_files
from potato_queue.bundle.write import BUNDLE_VERSION
from potato_queue.config import ProjectConfig
from potato_queue.wire.files import file_sha256, write_atomic

__all__ = ["BUILDER_FORMAT", "inputs_digest", "annotation_files", "write_inputs_file", "read_inputs_file"]

# Raised whenever the builder writes other bytes for the same inputs: bundles cached before are not reused.
BUILDER_FORMAT = 2  # 2: every data format Potato reads, pairwise answers and pairs


def _config_part(config: ProjectConfig, schemas: Sequence[str] | None) -> bytes:
    mt = config.model_training
    part = {
        "builder": [BUNDLE_VERSION, BUILDER_FORMAT],
        "schemas": list(schemas) if schemas is not None else None,
        "annotation_schemes": config.annotation_schemes,
        "item_properties": config.item_properties.model_dump(),
        "task_dir": str(config.task_path),
        "data_files": [str(p) for p in config.data_paths()],
        "data_file_entries": config.data_files,  # an entry's encoding is read too
        "output": str(config.output_path),
        "extra": config.model_extra or {},
        "aggregation": mt.aggregation,
        "splits": mt.splits,
        "split_seed": mt.split_seed,
        "include_unlabeled": mt.writeback.include_unlabeled,
    }
    return json.dumps(part, sort_keys=True, default=str).encode()


def _add_file(update: Callable[[bytes], object], path: Path) -> None:
    try:
        update(f"\0file {path} {file_sha256(path)}".encode())
    except OSError as exc:  # a missing data file: the build itself says so, with its fix
        update(f"\0file {path} unreadable {type(exc).__name__}".encode())


def _add_media(update: Callable[[bytes], object], folder: Path) -> None:
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            update(f"\0media {path} {stat.st_size} {stat.st_mtime_ns}".encode())


def inputs_digest(config: ProjectConfig, schemas: Sequence[str] | None) -> str:
    """sha256 of what build_bundle(config, _, schemas) reads."""
    digest = hashlib.sha256(_config_part(config, schemas))
    for path in config.data_paths():
        _add_file(digest.update, path)
    for _, path in annotator_files(config):
        _add_file(digest.update, path)
    media = str((config.model_extra or {}).get("media_directory") or "media")
    _add_media(digest.update, config.task_path / media)
    return digest.hexdigest()


def annotation_files(config: ProjectConfig) -> list[list[Any]]:
    """[name, size, mtime_ns] of each annotator's user_state.json: whether anything was labelled since (the
    insight's "what to label next" reads the files again only when this changed)."""
    files: list[list[Any]] = []
    for entry, path in annotator_files(config):
        try:
            stat = path.stat()
        except OSError:
            continue  # removed since it was listed
        files.append([entry, stat.st_size, stat.st_mtime_ns])
    return files


def write_inputs_file(path: Path, digest: str, annotations: list[list[Any]]) -> None:
    """A run's bundle.inputs: the digest its bundle was built from, and its annotators' files as they were."""
    write_atomic(path, json.dumps({"digest": digest, "annotations": annotations}))


def read_inputs_file(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None

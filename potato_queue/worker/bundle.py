"""Reading Potato's bundle v1 off disk.

A bundle folder holds ``train.jsonl``, ``val.jsonl``, ``test.jsonl``
(always, possibly empty), ``unlabeled.jsonl`` (optional, ``predict_only``),
``manifest.json``, ``labels.json`` and ``media/``. Rows are
``{"instance_id", "text", "targets": {schema: target}, "media"?}``.

Ours beyond Potato's: ``scales.json`` (wire/scales_file.py); a bundle Potato
built has none, and the trainers then take the scale from the answers.
"""

import os
from typing import Any, Dict, Iterator, List, Optional

from potato_queue.wire.files import JsonLineError, read_json, read_jsonl
from potato_queue.wire.scales_file import ScalesError, read_scales

from .errors import BundleError

__all__ = ["SPLITS", "PREDICT_SPLITS", "Bundle", "load_bundle"]

#: The splits a bundle may have, in Potato's order.
SPLITS = ("train", "val", "test", "unlabeled")
#: The splits predictions are written for. Never train.
PREDICT_SPLITS = ("val", "test", "unlabeled")


class Bundle:
    """A loaded bundle: its manifest, label vocabularies and split files."""

    def __init__(self, root: str, manifest: Dict[str, Any], labels: Dict[str, List[str]]) -> None:
        self.root = root
        self.manifest = manifest
        self._labels = labels
        try:
            self._scales = read_scales(root)
        except ScalesError as exc:
            raise BundleError(str(exc)) from exc

    @property
    def splits(self) -> Dict[str, Dict[str, Any]]:
        """``{split: {path, format, n, ...}}`` from the manifest."""
        return self.manifest.get("splits") or {}

    @property
    def modality(self) -> str:
        """The project's modality (``text`` unless the manifest says otherwise)."""
        return str(self.manifest.get("modality") or "text")

    @property
    def digest(self) -> str:
        """The manifest's digest of the split files."""
        return str(self.manifest.get("digest") or "")

    @property
    def media_dir(self) -> str:
        """Absolute path of the media folder."""
        return os.path.join(self.root, str(self.manifest.get("media_dir") or "media"))

    def has_split(self, split: str) -> bool:
        """Whether the bundle has *split* at all."""
        return split in self.splits

    def split_size(self, split: str) -> int:
        """The manifest's row count for *split* (0 when absent)."""
        entry = self.splits.get(split) or {}
        try:
            return int(entry.get("n", 0))
        except (TypeError, ValueError):
            return 0

    def split_path(self, split: str) -> Optional[str]:
        """Absolute path of *split*'s file, or None when the bundle has none."""
        entry = self.splits.get(split)
        if not entry:
            return None
        return os.path.join(self.root, str(entry.get("path") or split + ".jsonl"))

    def read_split(self, split: str) -> Iterator[Dict[str, Any]]:
        """Each row of *split* (nothing when the split is absent)."""
        path = self.split_path(split)
        if path is None:
            return
        try:
            for number, row in read_jsonl(path):
                if not isinstance(row, dict) or "instance_id" not in row:
                    raise BundleError("%s line %d is not a bundle row (no instance_id)" % (path, number))
                yield row
        except JsonLineError as exc:
            raise BundleError("%s line %d is not JSON: %s" % (path, exc.line, exc.reason)) from exc

    def labels(self, schema: str) -> List[str]:
        """The label vocabulary of *schema* (sorted observed labels), possibly empty."""
        return list(self._labels.get(schema) or [])

    def scale(self, schema: str) -> Dict[str, Any]:
        """*schema*'s scale from scales.json (``{}`` when the bundle gives none)."""
        return dict(self._scales.get(schema) or {})

    def resolve_media(self, reference: str) -> str:
        """A media reference as a path (URLs and absolute paths unchanged)."""
        if reference.startswith(("http://", "https://")) or os.path.isabs(reference):
            return reference
        return os.path.join(self.media_dir, reference)


def _read_json(path: str, what: str) -> Any:
    return read_json(path, "the bundle's " + what, BundleError)


def _default_splits(root: str) -> Dict[str, Dict[str, Any]]:
    """Split entries for a manifest without ``splits``: the standard files present."""
    found: Dict[str, Dict[str, Any]] = {}
    for split in SPLITS:
        if os.path.isfile(os.path.join(root, split + ".jsonl")):
            found[split] = {"path": split + ".jsonl", "format": "jsonl"}
    return found


def _check_splits(root: str, splits: Any) -> None:
    if not isinstance(splits, dict):
        raise BundleError("manifest.json 'splits' must be an object")
    if "train" not in splits:
        raise BundleError("The bundle at %s has no train split" % root)
    for name, entry in splits.items():
        if not isinstance(entry, dict):
            raise BundleError("manifest.json splits.%s must be an object" % name)
        fmt = entry.get("format", "jsonl")
        if fmt != "jsonl":
            raise BundleError("Split %s has format %r; this worker reads jsonl" % (name, fmt))
        path = os.path.join(root, str(entry.get("path") or name + ".jsonl"))
        if not os.path.isfile(path):
            raise BundleError("Split %s's file is missing: %s" % (name, path))


def _load_labels(root: str, manifest: Dict[str, Any]) -> Dict[str, List[str]]:
    labels = manifest.get("labels")
    path = os.path.join(root, "labels.json")
    if not labels and os.path.isfile(path):
        labels = _read_json(path, "labels.json")
    labels = labels or {}
    if not isinstance(labels, dict):
        raise BundleError("The bundle's labels must be an object {schema: [labels]}")
    return {str(k): [str(x) for x in (v or [])] for k, v in labels.items()}


def load_bundle(root: str) -> Bundle:
    """Open the bundle folder *root*, checking its manifest and split files."""
    if not os.path.isdir(root):
        raise BundleError("The bundle folder does not exist: %s" % root)
    manifest_path = os.path.join(root, "manifest.json")
    if not os.path.isfile(manifest_path):
        raise BundleError("No manifest.json in the bundle folder %s" % root)
    manifest = _read_json(manifest_path, "manifest.json")
    if not isinstance(manifest, dict):
        raise BundleError("manifest.json must hold a JSON object")
    version = manifest.get("v", 1)
    if version != 1:
        raise BundleError("The bundle is version %r; this worker reads version 1" % (version,))
    if "splits" not in manifest:
        manifest["splits"] = _default_splits(root)
    _check_splits(root, manifest["splits"])
    return Bundle(root, manifest, _load_labels(root, manifest))

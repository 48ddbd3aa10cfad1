"""Stage 3 of a bundle build: writing the bundle's files, and packing it.

The rows (in Potato's key order, media linked into media/), the seeded-hash
splits (split_of), the split files' bytes, the digest and modality, and
manifest.json and labels.json, all byte for byte as Potato writes them.
`pack_bundle` makes the tar.gz an agent downloads; the same bundle always
packs to the same bytes, so its sha256 names it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato_queue.bundle.modality import detect_modality, is_remote, item_media, item_pair, item_text
from potato_queue.bundle.read import Answers, Row, scheme_scale
from potato_queue.config import ModelTrainingConfig, ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.wire.scales_file import SCALES_FILE

# The public names, then what build_bundle uses.
__all__ = [
    "BUNDLE_VERSION",
    "DEFAULT_SPLITS",
    "pack_bundle",
    "split_of",
    "pair_text",
    "BundleBuild",
    "prepare_out_dir",
    "refuse_textless",
    "bundle_rows",
    "write_manifest",
    "write_splits",
]

BUNDLE_VERSION = 1
DEFAULT_SPLITS = {"train": 0.7, "val": 0.15, "test": 0.15}
_encode_text = json.encoder.encode_basestring  # json's own (C) string encoder, non-ASCII kept as json.dumps keeps it


def split_of(instance_id: str, splits: Mapping[str, float], seed: int) -> str:
    """An item's split: a seeded hash on cumulative bands, so held-out items stay held out."""
    return _splitter(splits, seed)(instance_id)


def _splitter(splits: Mapping[str, float], seed: int) -> Callable[[str], str]:
    """split_of for one set of splits: the bands worked out once."""
    total = sum(splits.values()) or 1.0
    bands, bound = [], 0.0
    for name in splits:
        bound += splits[name] / total  # accumulated as Potato does, so an edge case lands alike
        bands.append((bound, name))
    last, prefix = list(splits)[-1], f"{seed}:"

    def split(instance_id: str) -> str:
        # The first 8 hex digits of the sha256, as a number.
        position = int.from_bytes(hashlib.sha256((prefix + instance_id).encode()).digest()[:4], "big") / 0xFFFFFFFF
        return next((name for bound, name in bands if position <= bound), last)

    return split


class _RowEncoder:
    """json.dumps(row, ensure_ascii=False) for the rows _row makes, the same bytes without its per-call set-up
    (a bundle writes a row per item): keys in _row's order, strings by json's own C encoder, a row's targets
    encoded once per distinct set of them."""

    def __init__(self) -> None:
        self._targets: dict[tuple[Any, ...], str] = {}

    def __call__(self, row: Row) -> str:
        tail = _ROW_TAILS.get(tuple(row))
        if tail is None:
            return json.dumps(row, ensure_ascii=False)  # not a row _row made: json's own way
        line = '{"instance_id": ' + _encode_text(row["instance_id"]) + ', "text": ' + _encode_text(row["text"])
        for key in tail:
            if key == "targets":
                line += ', "targets": ' + self._encoded_targets(row[key])
            elif key == "pair":
                line += ', "pair": ' + json.dumps(row[key], ensure_ascii=False)
            else:
                line += f', "{key}": ' + _encode_text(row[key])
        return line + "}"

    def _encoded_targets(self, targets: Any) -> str:
        try:
            flat = tuple(targets.items())
            return self._targets[flat]
        except (AttributeError, TypeError, KeyError):
            text = json.dumps(targets, ensure_ascii=False)
        if type(targets) is dict and all(type(v) is str for v in targets.values()):  # 1 == True: text values only
            self._targets[flat] = text
        return text


# The keys of the rows _row makes, in its order: what follows instance_id and text.
_ROW_TAILS = {
    ("instance_id", "text", *tail): tuple(tail)
    for targets in [(), ("targets",)]
    for pair in [(), ("pair",)]
    for media in [(), ("media",), ("media_missing",)]
    for tail in [targets + pair + media]
}


@dataclass
class BundleBuild:
    """What one build needs while it walks the items, and the counts it reports."""

    out_dir: Path
    task_dir: str
    media_directory: str
    source_field: str | None
    text_key: str
    pair_key: str | None = None  # a pairwise run's: the item field holding the two texts it compares
    shown_as_image: bool = False  # Potato's page shows the media field as an image (instance_display)
    fetched: dict[str, Path] | None = None  # an image run's: the cached file of each address the server fetched
    stats: dict[str, Any] = field(
        default_factory=lambda: {
            "n_items": 0,
            "n_annotated": 0,
            "n_skipped_no_label": 0,
            "n_media_linked": 0,
            "n_media_missing": 0,
            "splits": {},
            "warnings": [],
        }
    )


def _link_media(build: BundleBuild, reference: str) -> str | None:
    """Symlink a media file into media/ (copy where links fail): its bundle path; None when missing."""
    if is_remote(reference):
        if build.fetched is None:
            return reference  # not an image run: Potato's way, the address as it is
        if reference not in build.fetched:
            build.stats["n_media_missing"] += 1
            return None  # named in the bundle's warnings (remote_media.py)
        reference = str(build.fetched[reference])  # the server fetched it: linked like a local file
    if reference.startswith("/media/"):  # the annotation page's URL for <task_dir>/<media_directory>/
        reference = os.path.join(build.task_dir, build.media_directory, reference[len("/media/") :])
    source = os.path.abspath(os.path.join(build.task_dir, reference))
    if not os.path.isfile(source):
        build.stats["n_media_missing"] += 1
        return None
    # Potato spreads a corpus over folders named by a hash of the file's path.
    path = f"{hashlib.sha1(source.encode()).hexdigest()[:2]}/{os.path.basename(source)}"
    dest = build.out_dir / "media" / path
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(dest):
        try:
            os.symlink(source, dest)  # a copy per run would duplicate a whole image corpus
        except (OSError, NotImplementedError):
            shutil.copy2(source, dest)
    build.stats["n_media_linked"] += 1
    return path


def pair_text(prompt: str, pair: Sequence[str]) -> str:
    """A compared pair as one text every text trainer reads (a fine-tune sees which text is which by its
    place): the prompt, if any, then "A: ..." and "B: ..."."""
    return (f"{prompt}\n\n" if prompt else "") + f"A: {pair[0]}\n\nB: {pair[1]}"


def _row(build: BundleBuild, iid: str, item: Row, targets: Answers | None) -> Row:
    """A bundle row, keys in Potato's order: instance_id, text, targets, then media or media_missing; a pairwise
    run's row carries its two texts as `pair` (after targets), and its text says both."""
    row: Row = {"instance_id": iid, "text": item_text(item, build.text_key)}
    pair = item_pair(item, build.pair_key)
    if pair is not None:
        row["text"] = pair_text("" if build.text_key == build.pair_key else row["text"], pair)
    if targets is not None:
        row["targets"] = targets
    if pair is not None:
        row["pair"] = pair
    reference = item_media(item, build.source_field)
    if reference:
        linked = _link_media(build, reference)
        row["media" if linked else "media_missing"] = linked or reference
    return row


def bundle_rows(
    build: BundleBuild,
    items: dict[str, Row],
    ids: Sequence[str],
    answered: Collection[str],
    targets: dict[str, Answers],
    include_unlabeled: bool,
) -> tuple[list[Row], list[Row]]:
    """Labelled and unlabeled rows in the order of `ids`, the items' ids sorted (media is linked in that order
    too)."""
    rows, unlabeled = [], []
    for iid in ids:
        if iid in targets:
            rows.append(_row(build, iid, items[iid], targets[iid]))
            continue
        build.stats["n_skipped_no_label"] += iid in answered  # answered, but nothing usable here
        if include_unlabeled:
            unlabeled.append(_row(build, iid, items[iid], None))
    return rows, unlabeled


def refuse_textless(
    config: ProjectConfig, build: BundleBuild, items: Mapping[str, Row], labelled: Collection[str]
) -> None:
    """Before anything is written: labelled items that are all without text, pair and media give a trainer
    nothing to learn from (scikit-learn says `empty vocabulary`, a fine-tune learns the label prior)."""

    def has_input(item: Row) -> bool:
        return bool(
            item_text(item, build.text_key).strip()
            or item_pair(item, build.pair_key)
            or item_media(item, build.source_field)
        )

    if labelled and not any(has_input(items[iid]) for iid in labelled):
        text_key = config.item_properties.text_key
        raise PotatoQueueError(
            f"all {len(labelled)} labelled items have an empty {text_key!r} (item_properties.text_key) and no media: "
            "a run would learn from nothing",
            fix=f"set item_properties.text_key in {config.config_path} to the field that holds each item's text "
            f"(potato-queue validate {config.config_path} names the fields the items have)",
        )


def write_splits(
    build: BundleBuild, splits: Mapping[str, float], seed: int, rows: list[Row], unlabeled: list[Row]
) -> dict[str, Row]:
    """Every split file (even empty) and unlabeled.jsonl when it has rows: their manifest entries."""
    by_split: dict[str, list[Row]] = {name: [] for name in splits}
    split, encoded = _splitter(splits, seed), _RowEncoder()
    for row in rows:
        by_split[split(row["instance_id"])].append(row)
    if unlabeled:
        by_split["unlabeled"] = unlabeled
    entries: dict[str, Row] = {}
    for name, split_rows in by_split.items():
        # Potato's bytes: default separators, non-ASCII text as is, "\n" after every row.
        with (build.out_dir / f"{name}.jsonl").open("w", encoding="utf-8", newline="\n") as fh:
            fh.writelines(encoded(row) + "\n" for row in split_rows)
        entries[name] = {"path": f"{name}.jsonl", "format": "jsonl", "n": len(split_rows)}
    if unlabeled:  # predicted on, never trained or scored on, and no split in the stats
        entries["unlabeled"]["predict_only"] = True
    build.stats["splits"] = {name: entries[name]["n"] for name in splits}
    if not build.stats["splits"].get("train"):
        build.stats["warnings"].append(
            f"The train split is empty. With {len(rows)} labelled items and these "
            "split fractions, everything landed elsewhere."
        )
    return entries


def _digest(paths: Sequence[Path]) -> str:
    """sha256 over the split files in sorted path order: each one's basename, then its bytes."""
    hasher = hashlib.sha256()
    for path in sorted(paths, key=str):
        hasher.update(path.name.encode())
        hasher.update(path.read_bytes())
    return hasher.hexdigest()


def prepare_out_dir(out_dir: Path) -> None:
    """An empty folder to write into: a previous bundle is replaced, anything else refused."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not (out_dir / "manifest.json").is_file():
            raise PotatoQueueError(
                f"{out_dir} is not empty and holds no bundle; writing one there would mix files",
                fix="give a new or empty folder",
            )
        shutil.rmtree(out_dir)  # a stale unlabeled.jsonl or media link must not outlive a rebuild
    (out_dir / "media").mkdir(parents=True)


def write_manifest(
    build: BundleBuild,
    training: ModelTrainingConfig,
    names: Sequence[str],
    by_name: Mapping[str, Mapping[str, Any]],
    kinds: Mapping[str, str],
    labels: Mapping[str, list[str]],
    splits: dict[str, Row],
    rows: Sequence[Row],
) -> dict[str, Any]:
    """manifest.json and labels.json, once the split files the digest hashes are written: the manifest."""
    out_dir = build.out_dir
    manifest = {
        "v": BUNDLE_VERSION,
        "schemas": [
            {
                "name": n,
                "annotation_type": by_name[n].get("annotation_type", ""),
                "kind": kinds[n],
                "labels": labels[n],
                "source_field": by_name[n].get("source_field"),
            }
            for n in names
        ],
        "splits": splits,
        "labels": labels,
        "media_dir": "media",
        "modality": detect_modality([by_name[n] for n in names], rows, build.shown_as_image),
        "text_key": build.text_key,
        "split_seed": training.split_seed,
        "aggregation": training.aggregation,
        "stats": build.stats,
        "digest": _digest([out_dir / entry["path"] for entry in splits.values()]),
    }
    # json.dump's defaults, indent 2, no final newline: Potato's bytes.
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    (out_dir / "labels.json").write_text(json.dumps(labels, indent=2), encoding="utf-8")
    scales = {n: scale for n in names if (scale := scheme_scale(by_name[n])) is not None}
    if scales:  # ours beyond Potato's files (wire/scales_file.py says why)
        (out_dir / SCALES_FILE).write_text(json.dumps(scales, indent=2), encoding="utf-8")
    return manifest


def pack_bundle(bundle_dir: Path, tar_path: Path) -> tuple[int, str]:
    """A tar.gz of the bundle, members at the top level: (bytes, sha256), the same for the same bundle.

    Names are sorted and times, owners and modes fixed; media symlinks are
    stored as the files they point at, since the agent's machine lacks them.
    """
    bundle_dir, tar_path = Path(bundle_dir), Path(tar_path)
    members = sorted((p.relative_to(bundle_dir).as_posix(), p) for p in bundle_dir.rglob("*"))
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        tar_path.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, path in members:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif path.is_file():
                info.size, info.mode = path.stat().st_size, 0o644
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                raise PotatoQueueError(f"{path} in the bundle points at no file", fix="build the bundle again")
    data = tar_path.read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()

"""Potato's training bundle (v1), written from a project on disk.

A bundle is the folder a trainer reads on its own: train/val/test.jsonl (and
unlabeled.jsonl for write-back), labels.json, media/ and manifest.json.
Potato 2.12.1's worker and ours read the same bundles and the manifest's
digest hashes the split files' bytes, so this reproduces Potato's
`training/dataset.py` exactly: which items and answers are read (read.py;
annotations.py, the annotators' half, on a second core for a large project),
how annotators are merged (aggregate.py: Dawid-Skene, else exact-match
majority), the rows' bytes and order and the seeded-hash splits (write.py;
docs/protocol.md). `pack_bundle` makes the tar.gz an agent
downloads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from potato_queue.bundle.aggregate import (
    all_targets,
    answered_items,
    no_labels_error,
    pick_answers,
    resolve_references,
)
from potato_queue.bundle.annotations import Annotations, count_annotations, no_cycle_collection, read_annotations
from potato_queue.bundle.modality import is_remote, item_media, items_modality, media_source
from potato_queue.bundle.read import (
    read_items,
    schema_kind,
    schema_names,
    target_schemas,
)
from potato_queue.bundle.remote_media import fetch_images
from potato_queue.bundle.write import (
    BUNDLE_VERSION,
    DEFAULT_SPLITS,
    BundleBuild,
    bundle_rows,
    pack_bundle,
    prepare_out_dir,
    refuse_textless,
    split_of,
    write_manifest,
    write_splits,
)
from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError
from potato_queue.schemes import pair_key, stored_field, stored_under
from potato_queue.store.keys import media_cache_dir

__all__ = [
    "BUNDLE_VERSION",
    "schema_kind",
    "target_schemas",
    "split_of",
    "build_bundle",
    "pack_bundle",
    "project_modality",
    "count_annotations",
    "read_answers",
]


def build_bundle(config: ProjectConfig, out_dir: Path, schemas: Sequence[str] | None = None) -> dict[str, Any]:
    """Write Potato's bundle v1 for `schemas` (default: every scheme with a target) into out_dir.

    Returns the manifest. PotatoQueueError for a missing data file, an
    unreadable user_state.json, an unknown scheme, nothing labelled, or an
    out_dir that holds something other than a bundle.
    """
    with no_cycle_collection():
        return _build(config, Path(out_dir), schema_names(config, schemas))


def _build(config: ProjectConfig, out_dir: Path, names: list[str]) -> dict[str, Any]:
    training = config.model_training
    by_name = {str(s.get("name")): s for s in config.annotation_schemes}
    bad: list[str] = []
    sources = list(dict.fromkeys([*names, *(stored_under(by_name[name]) for name in names)]))  # a row's multirate
    found, items = read_annotations(config, sources, while_reading=lambda: read_items(config, cleaned=bad))
    as_stored(found, by_name, names)
    ids = sorted(items)
    references = resolve_references(found, ids, training.aggregation, set(names))
    kinds = {name: schema_kind(by_name[name]) for name in names}
    targets, labels = all_targets(references, kinds)
    if not targets:  # Potato refuses when nobody answered; nothing to train on is refused too
        raise no_labels_error(config, len(items), found, names)
    schemes = [by_name[n] for n in names]
    source, shown_as_image = media_source(config, schemes)
    build = BundleBuild(
        out_dir=out_dir,
        text_key=config.item_properties.text_key,
        # Potato's path (normalised, symlinks kept): a linked file's folder is named by its hash.
        task_dir=os.path.normpath(os.path.join(config.config_path.parent, os.path.expanduser(config.task_dir))),
        media_directory=str((config.model_extra or {}).get("media_directory") or "media"),
        source_field=source,
        pair_key=next((key for scheme in schemes if (key := pair_key(scheme))), None),
        shown_as_image=shown_as_image,
    )
    refuse_textless(config, build, items, targets)
    labelled = {iid: items[iid] for iid in targets}
    if items_modality(config, schemes, labelled) == "image":  # the manifest's rule: its rows
        build.fetched = fetch_remote_images(config, build, items if training.writeback.include_unlabeled else labelled)
    prepare_out_dir(out_dir)
    answered = answered_items(found, items)
    build.stats.update(n_items=len(items), n_annotated=len(answered))
    if bad:
        build.stats["warnings"].append(
            f"{len(bad)} item(s) hold text that is not valid Unicode (a lone surrogate such as \\ud800), "
            f"replaced with U+FFFD: {', '.join(bad[:10])}{' ...' if len(bad) > 10 else ''}; fix the data file"
        )
    rows, unlabeled = bundle_rows(build, items, ids, answered, targets, training.writeback.include_unlabeled)
    splits = write_splits(build, training.splits or DEFAULT_SPLITS, training.split_seed, rows, unlabeled)
    return write_manifest(build, training, names, by_name, kinds, labels, splits, rows)


def as_stored(found: Annotations, by_name: dict[str, Any], names: Sequence[str]) -> Annotations:
    """`found` with each answer of a scheme that stores it under a fixed name (a pairwise "selection", a
    triage "decision") read as that name's value (aggregate.pick_answers): what every reader of answers
    that compares labels (the bundle, compare, agreement) needs."""
    fields = {
        name: (stored_under(by_name[name]), field, pair_key(by_name[name]) is not None)
        for name in names
        if name in by_name and (field := stored_field(by_name[name]))
    }
    if fields:
        pick_answers(found, fields, {name: schema_kind(by_name[name]) for name in fields})
    return found


def read_answers(config: ProjectConfig) -> Annotations:
    """Every annotator's answers to every scheme, each read in the shape its type stores it (as_stored)."""
    found, _ = read_annotations(config)
    by_name = {str(s.get("name")): s for s in config.annotation_schemes}
    return as_stored(found, by_name, list(by_name))


def fetch_remote_images(config: ProjectConfig, build: BundleBuild, items: dict[str, Any]) -> dict[str, Path]:
    """The images the bundle's items name by web address, from the media cache or fetched into it now; the
    ones that could not be fetched named in the bundle's warnings."""
    where: dict[str, list[str]] = {}
    for iid, item in items.items():
        reference = item_media(item, build.source_field)
        if reference and is_remote(reference):
            where.setdefault(reference, []).append(iid)
    fetched = fetch_images(where, media_cache_dir(config))
    if fetched.failed:
        named = [f"item {where[url][0]} ({url}): {why}" for url, why in list(fetched.failed.items())[:10]]
        more = f" and {len(fetched.failed) - 10} more" if len(fetched.failed) > 10 else ""
        build.stats["warnings"].append(
            f"{len(fetched.failed)} image address(es) could not be fetched by the server: {'; '.join(named)}{more}; "
            "fix the addresses in the data files, or put the images under the project's media folder"
        )
    return fetched.files


def project_modality(
    config: ProjectConfig, schemas: Sequence[str] | None = None, items: dict[str, Any] | None = None
) -> str:
    """What a run of `schemas` trains on (text, image, ...), from the config and its items (read here unless
    given), before any bundle is built: what a trainer's modalities are checked against."""
    by_name = {str(s.get("name")): s for s in config.annotation_schemes}
    chosen = [by_name[n] for n in (schemas if schemas is not None else target_schemas(config)) if n in by_name]
    try:
        items = read_items(config) if items is None else items
    except PotatoQueueError:
        return "text"  # a missing data file: the bundle's build says so, with its fix
    return items_modality(config, chosen, items)

"""Potato's training bundle (v1), written from a project on disk.

A bundle is the folder a trainer reads on its own: train/val/test.jsonl (and
unlabeled.jsonl for write-back), labels.json, media/ and manifest.json.
Potato 2.12.1's worker and ours read the same bundles and the manifest's
digest hashes the split files' bytes, so this reproduces Potato's
`training/dataset.py` exactly: which items and answers are read, how
annotators are merged (Dawid-Skene, else exact-match majority), the rows'
bytes and order, and the seeded-hash splits (/work/shared/POTATO-FORMATS.md).

`pack_bundle` makes the tar.gz an agent downloads; the same bundle always
packs to the same bytes, so its sha256 names it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import tarfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato_queue.config import ProjectConfig
from potato_queue.errors import PotatoQueueError

__all__ = ["BUNDLE_VERSION", "TARGET_KINDS", "schema_kind", "target_schemas", "split_of", "build_bundle", "pack_bundle"]

BUNDLE_VERSION = 1
DEFAULT_SPLITS = {"train": 0.7, "val": 0.15, "test": 0.15}

# Potato's schema kinds (server_utils/iaa/dispatcher.py), by annotation_type.
_KIND_OF_TYPE = {atype: kind for kind, types in {
    "nominal": "radio select triage pairwise conjoint", "ordinal": "likert confidence",
    "continuous": "slider number vas", "multilabel": "multiselect hierarchical_multiselect card_sort",
    "matrix": "multirate constant_sum soft_label semantic_differential range_slider bws best_worst_scaling",
    "span": "span error_span event_annotation coreference extractive_qa span_link tree_annotation",
    "text": "textbox text_edit", "ranking": "ranking", "geometry": "image_annotation",
    "temporal": "audio_annotation video_annotation", "episode": "episode_annotation",
    "rollout": "rollout_evaluation", "caption": "region_caption", "grounding": "grounding_eval",
    "spatial": "spatial_annotation", "volume": "volume_annotation", "segments": "temporal_grounding tiered_annotation",
    "trace": "process_reward trajectory_eval tool_call_review failure_attribution gui_trajectory",
}.items() for atype in types.split()}

#: The kinds Potato turns into a target. The rest (free text, matrices, traces)
#: would give a meaningless label, so a bundle without named schemes skips them.
TARGET_KINDS = ("nominal", "multilabel", "ordinal", "continuous", "span", "geometry", "grounding")

_UNSET = (None, "", False, 0, "false")  # Potato's "not selected"; the string "0" is a selection
_MEDIA_KEYS = ("image_url", "image", "image_path", "file_name", "audio_url", "audio", "audio_path",
               "video_url", "video", "video_path", "url", "path")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
_MODALITY_BY_TYPE = {
    "image_annotation": "image", "region_caption": "image", "grounding_eval": "image", "audio_annotation": "audio",
    "video_annotation": "video", "tiered_annotation": "audio", "spatial_annotation": "point_cloud",
    "episode_annotation": "video",
}

Row = dict[str, Any]
Answers = dict[str, Any]  # {schema: value_map}, one annotator's or the agreed one for one item


def schema_kind(scheme: Mapping[str, Any]) -> str:
    """Potato's kind of one annotation scheme ("unsupported" when unknown)."""
    atype = str(scheme.get("annotation_type") or "").strip().lower()
    kind = _KIND_OF_TYPE.get(atype, "unsupported")
    if kind == "multilabel" and (scheme.get("max_choices") or scheme.get("max_selections")) == 1:
        return "nominal"  # capped at one choice, it stores one label
    if atype == "confidence" and scheme.get("scale_type") == "slider":
        return "continuous"
    if atype == "pairwise":  # one type name, three widgets that store different shapes
        mode = str(scheme.get("mode") or "binary").strip().lower()
        return {"scale": "continuous", "multi_dimension": "matrix"}.get(mode, "nominal")
    return kind


def target_schemas(config: ProjectConfig) -> list[str]:
    """The config's schemes that give a training target, in config order."""
    return [str(s["name"]) for s in config.annotation_schemes if s.get("name") and schema_kind(s) in TARGET_KINDS]


def split_of(instance_id: str, splits: Mapping[str, float], seed: int) -> str:
    """An item's split: a seeded hash on cumulative bands, so held-out items stay held out."""
    total = sum(splits.values()) or 1.0
    position = int(hashlib.sha256(f"{seed}:{instance_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    bound = 0.0
    for name in splits:
        bound += splits[name] / total  # accumulated as Potato does, so an edge case lands alike
        if position <= bound:
            return name
    return list(splits)[-1]


def _items_of_text(content: str, id_key: str) -> Iterator[tuple[str, Row]]:
    """(id, item) of one data file (JSON array, object or lines); no id gives Potato's positional one."""
    try:
        payload = json.loads(content)
    except json.JSONDecodeError:
        payload = None
    if isinstance(payload, (list, dict)):
        for position, item in enumerate(payload if isinstance(payload, list) else [payload], 1):
            if isinstance(item, dict):
                yield str(item.get(id_key, f"item_{position}")), item
        return
    for number, line in enumerate(content.splitlines(), 1):
        try:
            item = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # Potato skips lines that are not JSON (CSV rows, stray text)
        if isinstance(item, dict):
            yield str(item.get(id_key, f"item_{number}")), item


def _read_items(config: ProjectConfig) -> dict[str, Row]:
    items: dict[str, Row] = {}
    for path in config.data_paths():
        if not path.is_file():
            raise PotatoQueueError(f"data file {path} does not exist, so the bundle would miss its items",
                                   fix=f"restore the file or correct data_files in {config.config_path}")
        items.update(_items_of_text(path.read_text(encoding="utf-8"), config.item_properties.id_key))
    return items


@dataclass
class _Annotations:
    """{(user, instance): answers}, and the annotators in first-seen order."""

    index: dict[tuple[str, str], Answers] = field(default_factory=dict)
    users: list[str] = field(default_factory=list)
    n_records: int = 0


def _label_maps(raw: Any) -> Answers:
    """Both encodings as {schema: {label: value}}: [[{schema, name}, value], ...] or the older dict."""
    if isinstance(raw, dict):
        return raw
    maps: Answers = {}
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            label, value = entry
            if isinstance(label, dict):
                maps.setdefault(label.get("schema", ""), {})[label.get("name", "")] = value
            else:
                maps.setdefault(str(label), {})[""] = value
    return maps


def _span_lists(raw: Any) -> dict[str, list[Any]]:
    """{schema: [span, ...]} from the list encoding ([span, value] pairs) or the older dict."""
    spans: dict[str, list[Any]] = {}
    for entry in raw if isinstance(raw, list) else []:
        span = entry[0] if isinstance(entry, (list, tuple)) and len(entry) == 2 else entry
        if isinstance(span, dict):
            spans.setdefault(span.get("schema", ""), []).append(span)
    for schema, found in (raw if isinstance(raw, dict) else {}).items():
        if isinstance(found, (list, dict)):
            spans[schema] = found if isinstance(found, list) else list(found.values())
    return spans


def _image_objects(maps: Answers, image_schemas: set[str]) -> dict[str, list[Any]]:
    """An image_annotation scheme keeps its shapes as a list (or its JSON text) in a label value."""
    found: dict[str, list[Any]] = {}
    for schema in image_schemas & set(maps):
        for value in maps[schema].values() if isinstance(maps[schema], dict) else []:
            try:
                value = json.loads(value) if isinstance(value, str) else value
            except json.JSONDecodeError:
                continue
            if isinstance(value, list):
                found[schema] = value
    return found


def _user_records(state: Mapping[str, Any], image_schemas: set[str]) -> Iterator[tuple[str, Answers]]:
    """(instance id, answers) for every instance one user state mentions."""
    labels = state.get("instance_id_to_label_to_value") or {}
    spans = state.get("instance_id_to_span_to_value") or {}
    for iid in {**dict.fromkeys(labels), **dict.fromkeys(spans)}:
        maps = _label_maps(labels.get(iid, {}))
        answers = dict(maps)  # spans, then image shapes, replace a label map of the same scheme
        answers.update({s: {"_spans": found} for s, found in _span_lists(spans.get(iid, [])).items()})
        answers.update({s: {"_objects": found} for s, found in _image_objects(maps, image_schemas).items()})
        yield str(iid), answers


def _read_state(path: Path) -> Mapping[str, Any]:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PotatoQueueError(f"{path} cannot be read as JSON ({exc})",
                               fix="restore it from a backup, or move that annotator's folder aside") from None
    return state if isinstance(state, dict) else {}


def _read_annotations(config: ProjectConfig) -> _Annotations:
    found = _Annotations()
    out = config.output_path
    image_schemas = {str(s.get("name")) for s in config.annotation_schemes
                     if s.get("annotation_type") == "image_annotation"}
    # Folders in sorted order (it decides ties); one without a user_state.json (training/) is no annotator.
    for entry in sorted(os.listdir(out)) if out.is_dir() else []:
        if not (out / entry / "user_state.json").is_file():
            continue
        state = _read_state(out / entry / "user_state.json")
        user = str(state.get("user_id", entry))
        for iid, answers in _user_records(state, image_schemas):
            found.n_records += 1
            if user and iid and user not in found.users:
                found.users.append(user)  # counted even when every answer is empty, as Potato does
            if user and iid and answers:
                found.index[(user, iid)] = answers
    return found


def _canonical(value_map: Any) -> tuple[str, Any]:
    """The exact-match key of one answer, and the answer as a map."""
    value_map = value_map if isinstance(value_map, dict) else {"_value": value_map}
    return json.dumps(value_map, sort_keys=True, ensure_ascii=False), value_map


def _majority(found: _Annotations, ids: Sequence[str]) -> dict[str, Answers]:
    """Per item and scheme, the most frequent exact answer; a tie goes to the first annotator's."""
    references: dict[str, Answers] = {}
    for iid in ids:
        votes: dict[str, list[tuple[str, Any]]] = {}
        for user in found.users:
            for schema, value_map in found.index.get((user, iid), {}).items():
                votes.setdefault(schema, []).append(_canonical(value_map))
        for schema, pairs in votes.items():
            winner = Counter(key for key, _ in pairs).most_common(1)[0][0]
            references.setdefault(iid, {})[schema] = next(value for key, value in pairs if key == winner)
    return references


def _ds_confusions(posteriors: dict[str, list[float]], observed: dict[str, list[tuple[str, int]]],
                   workers: list[str], k: int) -> dict[str, list[list[float]]]:
    """M-step: each worker's P(says l | truly j); uniform for a class they never met."""
    num = {w: [[0.0] * k for _ in range(k)] for w in workers}
    den = {w: [0.0] * k for w in workers}
    for item, seen in observed.items():
        for worker, said in seen:
            for j in range(k):
                num[worker][j][said] += posteriors[item][j]
                den[worker][j] += posteriors[item][j]
    return {w: [[num[w][j][s] / den[w][j] for s in range(k)] if den[w][j] > 0 else [1.0 / k] * k for j in range(k)]
            for w in workers}


def _dawid_skene(observations: list[tuple[str, str, str]], max_iter: int = 100, tol: float = 1e-6) -> dict[str, str]:
    """{item: label} by Potato's Dawid-Skene EM, the same float operations in the same order."""
    workers = sorted({w for w, _, _ in observations})
    classes = sorted({label for _, _, label in observations})
    k = len(classes)
    observed: dict[str, list[tuple[str, int]]] = {item: [] for item in sorted({i for _, i, _ in observations})}
    for worker, item, label in observations:
        observed[item].append((worker, classes.index(label)))
    if k == 1:
        return dict.fromkeys(observed, classes[0])
    posteriors = {item: [float(sum(1 for _, s in seen if s == j)) for j in range(k)] for item, seen in observed.items()}
    posteriors = {item: [c / sum(counts) for c in counts] for item, counts in posteriors.items()}
    previous = None
    for _ in range(max_iter):
        prior = [0.0] * k
        for item in observed:
            for j in range(k):
                prior[j] += posteriors[item][j]
        prior = [p / (sum(prior) or 1.0) for p in prior]
        confusion = _ds_confusions(posteriors, observed, workers, k)
        likelihood = 0.0
        for item, seen in observed.items():
            scores = list(prior)
            for worker, said in seen:
                for j in range(k):
                    scores[j] *= confusion[worker][j][said]
            mass = sum(scores)
            posteriors[item] = [x / mass for x in scores] if mass > 0 else [1.0 / k] * k
            likelihood += math.log(mass) if mass > 0 else 0.0
        if previous is not None and abs(likelihood - previous) < tol:
            break
        previous = likelihood
    # max() keeps the first of equal posteriors: a tie goes to the first class in sorted order.
    return {item: classes[max(range(k), key=lambda j: p[j])] for item, p in posteriors.items()}


def _consensus(found: _Annotations, ids: Sequence[str]) -> dict[str, Answers]:
    """Dawid-Skene per scheme, each distinct exact answer a class."""
    observations: dict[str, list[tuple[str, str, str]]] = {}
    answer_of: dict[str, dict[str, Any]] = {}
    for user in found.users:
        for iid in ids:
            for schema, value_map in found.index.get((user, iid), {}).items():
                key, answer = _canonical(value_map)
                observations.setdefault(schema, []).append((user, iid, key))
                # The last annotator's map stands for its class: it orders a multilabel list.
                answer_of.setdefault(schema, {})[key] = answer
    references: dict[str, Answers] = {}
    for schema, seen in observations.items():
        for iid, key in _dawid_skene(seen).items():
            references.setdefault(iid, {})[schema] = answer_of[schema][key]
    return references


def _resolve(found: _Annotations, ids: Sequence[str], aggregation: str) -> dict[str, Answers]:
    """One agreed answer per item: consensus needs two annotators, else (or on failure) majority."""
    if aggregation == "consensus" and len(found.users) > 1:
        try:
            return _consensus(found, ids)
        except (ArithmeticError, ValueError, TypeError):
            pass  # Potato falls back to majority the same way
    return _majority(found, ids)


def _chosen(value_map: Any) -> list[str]:
    if isinstance(value_map, dict):
        return [str(name) for name, value in value_map.items() if value not in _UNSET]
    return [value_map] if isinstance(value_map, str) else []


def _label_of(value_map: Any) -> str | None:
    """The one selected label; None for none or several."""
    if not isinstance(value_map, (str, dict)):
        return None if value_map is None else str(value_map)
    chosen = _chosen(value_map)
    return chosen[0] if len(chosen) == 1 else None


def _target(kind: str, value_map: Any) -> Any:
    """The training target of one agreed answer, by schema kind."""
    if kind == "multilabel":
        return _chosen(value_map)
    if kind in ("span", "geometry", "grounding"):
        return value_map.get("_spans" if kind == "span" else "_objects", []) if isinstance(value_map, dict) else []
    if kind in ("ordinal", "continuous"):
        single = isinstance(value_map, dict) and len(value_map) == 1
        try:
            return float(next(iter(value_map.values())) if single else value_map)
        except (TypeError, ValueError):
            return _label_of(value_map)  # an older file's {"4": "true"} gives the label "4", not 4.0
    return _label_of(value_map)


def _all_targets(references: dict[str, Answers], kinds: dict[str, str]
                 ) -> tuple[dict[str, Answers], dict[str, list[str]]]:
    """{item: targets} of the items with a usable answer, and the sorted labels seen per scheme."""
    targets: dict[str, Answers] = {}
    seen: dict[str, set[str]] = {name: set() for name in kinds}
    for iid, resolved in references.items():
        for name, kind in kinds.items():
            target = _target(kind, resolved[name]) if name in resolved else None
            if target is None or target == [] or target == "":
                continue
            targets.setdefault(iid, {})[name] = target
            if kind in ("multilabel", "nominal"):  # only these have a vocabulary
                seen[name].update(map(str, target) if kind == "multilabel" else [str(target)])
    return targets, {name: sorted(labels) for name, labels in seen.items()}


@dataclass
class _Build:
    """What one build needs while it walks the items, and the counts it reports."""

    out_dir: Path
    task_dir: str
    media_directory: str
    source_field: str | None
    text_key: str
    stats: dict[str, Any] = field(default_factory=lambda: {
        "n_items": 0, "n_annotated": 0, "n_skipped_no_label": 0, "n_media_linked": 0, "n_media_missing": 0,
        "splits": {}, "warnings": []})


def _link_media(build: _Build, reference: str) -> str | None:
    """Symlink a media file into media/ (copy where links fail): its bundle path; None when missing."""
    if reference.startswith(("http://", "https://")):
        return reference  # the trainer fetches remote media itself
    if reference.startswith("/media/"):  # the annotation page's URL for <task_dir>/<media_directory>/
        reference = os.path.join(build.task_dir, build.media_directory, reference[len("/media/"):])
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


def _row(build: _Build, iid: str, item: Row, targets: Answers | None) -> Row:
    """A bundle row, keys in Potato's order: instance_id, text, targets, then media or media_missing."""
    row: Row = {"instance_id": iid, "text": str(item.get(build.text_key, "") or "")}
    if targets is not None:
        row["targets"] = targets
    reference = next((str(item[k]) for k in (build.source_field, *_MEDIA_KEYS) if k and item.get(k)), None)
    if reference:
        linked = _link_media(build, reference)
        row["media" if linked else "media_missing"] = linked or reference
    return row


def _rows(build: _Build, items: dict[str, Row], references: dict[str, Answers], targets: dict[str, Answers],
          include_unlabeled: bool) -> tuple[list[Row], list[Row]]:
    """Labelled and unlabeled rows in sorted id order (media is linked in that order too)."""
    rows, unlabeled = [], []
    for iid in sorted(items):
        if iid in targets:
            rows.append(_row(build, iid, items[iid], targets[iid]))
            continue
        build.stats["n_skipped_no_label"] += iid in references  # answered, but nothing usable here
        if include_unlabeled:
            unlabeled.append(_row(build, iid, items[iid], None))
    return rows, unlabeled


def _write_splits(build: _Build, splits: Mapping[str, float], seed: int, rows: list[Row],
                  unlabeled: list[Row]) -> dict[str, Row]:
    """Every split file (even empty) and unlabeled.jsonl when it has rows: their manifest entries."""
    by_split: dict[str, list[Row]] = {name: [] for name in splits}
    for row in rows:
        by_split[split_of(row["instance_id"], splits, seed)].append(row)
    if unlabeled:
        by_split["unlabeled"] = unlabeled
    entries: dict[str, Row] = {}
    for name, split_rows in by_split.items():
        # Potato's bytes: default separators, non-ASCII text as is, "\n" after every row.
        with (build.out_dir / f"{name}.jsonl").open("w", encoding="utf-8", newline="\n") as fh:
            fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in split_rows)
        entries[name] = {"path": f"{name}.jsonl", "format": "jsonl", "n": len(split_rows)}
    if unlabeled:  # predicted on, never trained or scored on, and no split in the stats
        entries["unlabeled"]["predict_only"] = True
    build.stats["splits"] = {name: entries[name]["n"] for name in splits}
    if not build.stats["splits"].get("train"):
        build.stats["warnings"].append(f"The train split is empty. With {len(rows)} labelled items and these "
                                       "split fractions, everything landed elsewhere.")
    return entries


def _digest(paths: Sequence[Path]) -> str:
    """sha256 over the split files in sorted path order: each one's basename, then its bytes."""
    hasher = hashlib.sha256()
    for path in sorted(paths, key=str):
        hasher.update(path.name.encode())
        hasher.update(path.read_bytes())
    return hasher.hexdigest()


def _modality(schemes: Sequence[Mapping[str, Any]], rows: Sequence[Row]) -> str:
    """From a scheme's type; else images when 80% of labelled rows name an image file; else text."""
    for scheme in schemes:
        if scheme.get("annotation_type", "") in _MODALITY_BY_TYPE:
            return _MODALITY_BY_TYPE[scheme["annotation_type"]]

    def names_image(row: Row) -> bool:
        ref = str(row.get("media") or row.get("media_missing") or "")
        text = str(row.get("text") or "").strip()
        # A remote image on an item that shows text does not make the corpus images.
        remote_only = not ref.startswith(("http://", "https://")) or not text or text == ref
        return ref.lower().split("?")[0].endswith(_IMAGE_SUFFIXES) and remote_only

    return "image" if rows and sum(map(names_image, rows)) >= 0.8 * len(rows) else "text"


def _prepare_out_dir(out_dir: Path) -> None:
    """An empty folder to write into: a previous bundle is replaced, anything else refused."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not (out_dir / "manifest.json").is_file():
            raise PotatoQueueError(f"{out_dir} is not empty and holds no bundle; writing one there would mix files",
                                   fix="give a new or empty folder")
        shutil.rmtree(out_dir)  # a stale unlabeled.jsonl or media link must not outlive a rebuild
    (out_dir / "media").mkdir(parents=True)


def _schema_names(config: ProjectConfig, schemas: Sequence[str] | None) -> list[str]:
    names = list(schemas) if schemas is not None else target_schemas(config)
    unknown = [n for n in names if n not in config.schema_names()]
    if unknown or not names:
        raise PotatoQueueError(
            f"no annotation scheme named {', '.join(unknown)}" if unknown else "no annotation scheme gives a target",
            fix=f"name schemes of {config.config_path} ({', '.join(config.schema_names()) or 'none'}) whose kind "
            f"is one of {', '.join(TARGET_KINDS)}")
    return names


def _no_labels(config: ProjectConfig, n_items: int, found: _Annotations, names: Sequence[str]) -> PotatoQueueError:
    return PotatoQueueError(
        f"no labelled items to train on: {n_items} items and {found.n_records} annotation records under "
        f"{config.output_path}, none with a usable answer for {', '.join(names)}",
        fix="label some items in Potato first (answers are read from <output_annotation_dir>/<user>/user_state.json), "
        "and check that data_files, item_properties.id_key and the scheme names match what was annotated")


def build_bundle(config: ProjectConfig, out_dir: Path, schemas: Sequence[str] | None = None) -> dict[str, Any]:
    """Write Potato's bundle v1 for `schemas` (default: every scheme with a target) into out_dir.

    Returns the manifest. PotatoQueueError for a missing data file, an
    unreadable user_state.json, an unknown scheme, nothing labelled, or an
    out_dir that holds something other than a bundle.
    """
    names, training = _schema_names(config, schemas), config.model_training
    by_name = {str(s.get("name")): s for s in config.annotation_schemes}
    items, found = _read_items(config), _read_annotations(config)
    references = _resolve(found, sorted(items), training.aggregation)
    kinds = {name: schema_kind(by_name[name]) for name in names}
    targets, labels = _all_targets(references, kinds)
    if not targets:  # Potato refuses when nobody answered; nothing to train on is refused too
        raise _no_labels(config, len(items), found, names)
    out_dir = Path(out_dir)
    _prepare_out_dir(out_dir)
    build = _Build(
        out_dir=out_dir, text_key=config.item_properties.text_key,
        # Potato's path (normalised, symlinks kept): a linked file's folder is named by its hash.
        task_dir=os.path.normpath(os.path.join(config.config_path.parent, os.path.expanduser(config.task_dir))),
        media_directory=str((config.model_extra or {}).get("media_directory") or "media"),
        source_field=by_name[names[0]].get("source_field"))  # Potato reads the first scheme's only
    build.stats.update(n_items=len(items), n_annotated=len(references))
    rows, unlabeled = _rows(build, items, references, targets, training.writeback.include_unlabeled)
    splits = _write_splits(build, training.splits or DEFAULT_SPLITS, training.split_seed, rows, unlabeled)
    manifest = {
        "v": BUNDLE_VERSION,
        "schemas": [{"name": n, "annotation_type": by_name[n].get("annotation_type", ""), "kind": kinds[n],
                     "labels": labels[n], "source_field": by_name[n].get("source_field")} for n in names],
        "splits": splits, "labels": labels, "media_dir": "media",
        "modality": _modality([by_name[n] for n in names], rows),
        "text_key": build.text_key, "split_seed": training.split_seed, "aggregation": training.aggregation,
        "stats": build.stats, "digest": _digest([out_dir / entry["path"] for entry in splits.values()]),
    }
    # json.dump's defaults, indent 2, no final newline: Potato's bytes.
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    (out_dir / "labels.json").write_text(json.dumps(labels, indent=2), encoding="utf-8")
    return manifest


def pack_bundle(bundle_dir: Path, tar_path: Path) -> tuple[int, str]:
    """A tar.gz of the bundle, members at the top level: (bytes, sha256), the same for the same bundle.

    Names are sorted and times, owners and modes fixed; media symlinks are
    stored as the files they point at, since the agent's machine lacks them.
    """
    bundle_dir, tar_path = Path(bundle_dir), Path(tar_path)
    members = sorted((p.relative_to(bundle_dir).as_posix(), p) for p in bundle_dir.rglob("*"))
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    with tar_path.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
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

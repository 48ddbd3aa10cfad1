"""Potato's own example projects (tests/fixtures/potato_examples, copied from Potato's repository) with three
annotators' answers added in the shape Potato's page stores each annotation type (user_state.json's
`[[{"schema": S, "name": NAME}, VALUE], ...]`, spans apart): what a new user's project looks like.

Each annotator agrees with an item's "truth" (drawn from the item's id) four times in five, so the answers
disagree as real ones do and the consensus is mostly the truth.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

__all__ = ["EXAMPLES", "ANNOTATORS", "example_project", "stored_answer", "items_of"]

EXAMPLES = ROOT / "tests" / "fixtures" / "potato_examples"
ANNOTATORS = ("ann", "ben", "cai")


def _labels(scheme: dict[str, Any]) -> list[str]:
    return [str(x.get("name") if isinstance(x, dict) else x) for x in scheme.get("labels") or []]


def stored_answer(scheme: dict[str, Any], rng: random.Random, item: dict[str, Any]) -> list[list[Any]]:
    """One annotator's answer to one scheme, as Potato's page stores it (helper-read from Potato 2.12.1)."""
    name, atype = scheme["name"], scheme["annotation_type"]

    def entry(label: str, value: Any) -> list[Any]:
        return [{"schema": name, "name": label}, value]

    if atype == "radio":
        label = rng.choice(_labels(scheme))
        return [entry(label, label)]
    if atype == "multiselect":
        return [entry(label, label) for label in rng.sample(_labels(scheme), rng.randint(1, 2))]
    if atype == "likert":
        point = str(rng.randint(1, int(scheme.get("size") or 5)))
        return [entry(point, point)]
    if atype == "slider":
        return [entry("slider", str(rng.randrange(int(scheme["min_value"]), int(scheme["max_value"]) + 1)))]
    if atype == "vas":
        return [entry(name, f"{rng.uniform(0, 100):.1f}")]
    if atype == "confidence":
        level = str(rng.randint(1, int(scheme.get("scale_points") or 5)))
        return [entry(level, level)]
    if atype == "triage":
        return [entry("decision", rng.choice(["accept", "reject", "skip"]))]
    if atype == "pairwise" and scheme.get("mode") == "scale":
        scale = scheme.get("scale") or {}
        return [entry("scale_value", str(rng.randint(int(scale.get("min", -3)), int(scale.get("max", 3)))))]
    if atype == "pairwise":
        return [entry("selection", rng.choice(["A", "B", "tie"] if scheme.get("allow_tie") else ["A", "B"]))]
    if atype == "multirate":
        return [entry(str(row), rng.choice(_labels(scheme))) for row in scheme["options"]]
    if atype == "ranking":
        order = _labels(scheme)
        rng.shuffle(order)
        return [entry("rank_order", ",".join(order))]
    if atype in ("text", "textbox"):
        return [entry("text_box", f"note {rng.randint(1, 9)}")]
    return []


def _span(scheme: dict[str, Any], rng: random.Random, iid: str, text: str) -> list[list[Any]]:
    words = [(n, n + len(w)) for n, w in _word_starts(text)]
    if not words:
        return []
    start, end = rng.choice(words)
    label = rng.choice(_labels(scheme))
    key = {"schema": scheme["name"], "name": label, "title": label, "start": start, "end": end}
    return [[{**key, "id": f"span_{iid}_{start}_{end}", "target_field": None}, text[start:end]]]


def _word_starts(text: str) -> list[tuple[int, str]]:
    found, at = [], 0
    for word in text.split(" "):
        if word.strip(".,"):
            found.append((at, word.strip(".,")))
        at += len(word) + 1
    return found


def items_of(config_path: Path) -> dict[str, dict[str, Any]]:
    """The project's items as Potato's own server parser reads them (potato.data_sources.parsing)."""
    from potato.data_sources.parsing import parse_delimited, parse_json_records, read_text

    config = yaml.safe_load(config_path.read_text())
    id_key = (config.get("item_properties") or {}).get("id_key", "id")
    items: dict[str, dict[str, Any]] = {}
    for written in config["data_files"]:
        path = config_path.parent / (config.get("task_dir") or ".") / written
        text = read_text(str(path))
        if path.suffix in (".csv", ".tsv"):
            rows = parse_delimited(text, "," if path.suffix == ".csv" else "\t", str(path))
        else:
            rows = parse_json_records(text, str(path), json_array=path.suffix == ".json")
        items.update({str(row[id_key]): row for row in rows})
    return items


def example_project(
    name: str, dest: Path, n_annotators: int = 3, top: dict[str, Any] | None = None, **training: Any
) -> Path:
    """A copy of Potato's example `name` in dest, three annotators' answers added, training enabled (and the
    `top` config keys set, an admin key say): its config's path."""
    shutil.copytree(EXAMPLES / name, dest)
    config_path = dest / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config.update(top or {})
    config["model_training"] = {"enabled": True, **training}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    items = items_of(config_path)
    text_key = (config.get("item_properties") or {}).get("text_key", "text")
    out = dest / (config.get("task_dir") or ".") / config.get("output_annotation_dir", "annotation_output")
    for user in ANNOTATORS[:n_annotators]:
        labels, spans = {}, {}
        for iid, item in items.items():
            truth, noise = random.Random(f"truth:{iid}"), random.Random(f"{user}:{iid}")
            rng = truth if noise.random() < 0.8 else noise
            answers = [
                e for s in config["annotation_schemes"] for e in stored_answer(s, random.Random(rng.random()), item)
            ]
            span = [
                e
                for s in config["annotation_schemes"]
                if s["annotation_type"] == "span"
                for e in _span(s, random.Random(rng.random()), iid, str(item.get(text_key) or ""))
            ]
            if answers:
                labels[iid] = answers
            if span:
                spans[iid] = span
        state = {"user_id": user, "instance_id_to_label_to_value": labels, "instance_id_to_span_to_value": spans}
        (out / user).mkdir(parents=True, exist_ok=True)
        (out / user / "user_state.json").write_text(json.dumps(state))
    return config_path

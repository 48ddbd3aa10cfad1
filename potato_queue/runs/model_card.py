"""The README.md a run's model is published with: a Hugging Face Hub model card written from the run.

What it says comes from the run itself: its record (the bundle's items per split, the held-out scores,
the params it was asked for) and the trainer's own model_card.json in its model files, whose top-level
shape every trainer shares: `{"trainer", "settings": {"model_name", "lora": {...} | null, ...}, "schemas":
{name: {"label_order", "n_train", "folder"}}}` (sklearn-text writes `params` for `settings`). Where the
trainer wrote no card, the record's params and the project's schemes stand in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

import yaml

from potato_queue.config import ProjectConfig
from potato_queue.run import RunRecord
from potato_queue.trainers.common import CARD_FILE

__all__ = ["HUB_NAME", "trainer_card", "base_model", "model_card"]

# One part of a Hub repo id (huggingface_hub's validate_repo_id): letters, digits, - _ . ; neither starting
# nor ending with - or . (the length, `--` and `..` are checked where a whole id is).
HUB_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_BASE_MODEL = re.compile(rf"^(?:{HUB_NAME}/)?{HUB_NAME}$")
# Settings that name this machine's folders, not the model: never in a card others read.
_LOCAL_ONLY = frozenset({"packaged_folder"})


def trainer_card(artifacts: Path) -> dict[str, Any]:
    """The trainer's model_card.json among the model files ({} where it wrote none, or not JSON)."""
    try:
        card = json.loads((artifacts / CARD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return card if isinstance(card, dict) else {}


def _settings(record: RunRecord, card: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's resolved settings, else the params the run was asked for."""
    found = card.get("settings", card.get("params"))
    return dict(found) if isinstance(found, Mapping) else dict(record.get("params") or {})


def base_model(settings: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the Hub id for the card's `base_model`, the words for it): a local folder is named by its last part
    only, and is no Hub id."""
    name = settings.get("model_name")
    if not isinstance(name, str) or not name:
        return None, None
    if _BASE_MODEL.fullmatch(name) and not Path(name).expanduser().exists():
        return name, name
    return None, f"a local folder ({PurePath(name).name})"


def _front_matter(record: RunRecord, base: str | None) -> str:
    trainer = str(record.get("trainer") or "")
    meta: dict[str, Any] = {}
    if trainer.startswith("hf-"):
        meta["library_name"] = "transformers"
    meta["tags"] = ["potato-queue", "potato-annotation", trainer] + (
        ["text-classification"] if trainer == "hf-text-classification" else []
    )
    if base:
        meta["base_model"] = base
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _score(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.4f}"


def _data(record: RunRecord, config: ProjectConfig) -> list[str]:
    counts = (record.get("bundle") or {}).get("n") or {}
    lines = [
        "## Data",
        "",
        f'Annotations of the Potato project "{config.annotation_task_name or "unnamed"}", '
        "split by potato-queue into train, val and test.",
        "",
    ]
    if counts:
        lines += ["| split | items |", "|---|---|"] + [f"| {split} | {n} |" for split, n in counts.items()]
    else:
        lines.append("The items per split were not recorded.")
    return lines + [""]


def _schemas(record: RunRecord, card: Mapping[str, Any], config: ProjectConfig) -> list[str]:
    offered = {str(s.get("name")): s.get("labels") or [] for s in config.annotation_schemes}
    cards = card.get("schemas")
    lines = ["## Schemas and labels", ""]
    for name in record.get("schemas") or []:
        found = cards.get(name) if isinstance(cards, Mapping) else None
        mine: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        labels = mine.get("label_order") or [
            x.get("name") if isinstance(x, Mapping) else x for x in offered.get(name, [])
        ]
        folder = f" (model in `{mine['folder']}/`)" if mine.get("folder") else ""
        lines.append(f"- **{name}**{folder}: {', '.join(map(str, labels)) or 'labels not recorded'}")
    return lines + [""]


def _held_out(record: RunRecord) -> list[str]:
    lines = [
        "## Held-out scores",
        "",
        "Scored by potato-queue on the splits the model never trained on.",
        "",
        "| schema | split | accuracy | macro-F1 | items |",
        "|---|---|---|---|---|",
    ]
    for schema, splits in (record.get("held_out") or {}).items():
        for split, s in (splits or {}).items():
            lines.append(
                f"| {schema} | {split} | {_score(s.get('accuracy'))} | {_score(s.get('macro_f1'))} | {s.get('n', 0)} |"
            )
    return lines + [""]


def _lora(lora: Any) -> str:
    if not isinstance(lora, Mapping):
        return "none (every weight fine-tuned)"
    modules = lora.get("target_modules")
    shown = ", ".join(map(str, modules)) if isinstance(modules, list) else (modules or "the peft default for the model")
    rest = ", ".join(f"{k}={v}" for k, v in lora.items() if k != "target_modules")
    return f"{rest}, target modules: {shown}"


def _training(record: RunRecord, card: Mapping[str, Any], settings: Mapping[str, Any], words: str | None) -> list[str]:
    shown = {k: v for k, v in settings.items() if k not in _LOCAL_ONLY}
    if words and "model_name" in shown:
        shown["model_name"] = words
    lines = [
        "## Training",
        "",
        f"- Trainer: `{card.get('trainer') or record.get('trainer')}` (potato-queue)",
        f"- Base model: {words or 'none (the trainer uses no pretrained model)'}",
    ]
    if "lora" in settings:
        lines.append(f"- LoRA: {_lora(settings.get('lora'))}")
    lines += [
        f"- Run: {record.get('run_id')}, finished {record.get('finished_at')}",
        "",
        "The trainer's params:",
        "",
        "```json",
        json.dumps(shown, indent=2, sort_keys=True, default=str),
        "```",
        "",
    ]
    return lines


def model_card(record: RunRecord, card: Mapping[str, Any], config: ProjectConfig, repo_id: str) -> str:
    """README.md's text: YAML front matter (library_name, tags, base_model where it is a Hub model), then
    the data, the schemas and their labels, the held-out scores and how it was trained."""
    settings = _settings(record, card)
    base, words = base_model(settings)
    body = [
        f"# {repo_id.rsplit('/', 1)[-1]}",
        "",
        f"A model trained by potato-queue from annotations made in Potato (run {record.get('run_id')}).",
        "",
        *_data(record, config),
        *_schemas(record, card, config),
        *_held_out(record),
        *_training(record, card, settings, words),
    ]
    return _front_matter(record, base) + "\n" + "\n".join(body)

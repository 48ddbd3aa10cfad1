"""A succeeded run as a declared machine rater in Potato: its held-out answers in a user state of its own.

Potato 2.12 keeps people and machines apart by a user state's `origin` (potato/annotator_origin.py: absent
means human; a kind `tool` or `llm` is a machine), and its agreement report (/admin/iaa), adjudication
(`include_machine_annotators`) and psychometrics then treat the rater as a machine. The rater is
<output_annotation_dir>/potato-queue.<trainer>.<schemes>/user_state.json: one per trainer and set of
schemes, a newer run replacing the older one's file in one rename, the annotators' own files never opened
for writing. Only the run's held-out items (val, test) are answered: on its own train split a model
would agree with the labels it learnt, which says nothing. Potato reads user states when it starts
(flask_server.load_user_data); a running Potato shows the rater from its next start.

The rater is never an annotator to potato-queue: bundle/annotations.py leaves its folder out, so its
answers are no training label, no vote and no new work for auto-retrain.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from potato_queue.bundle.user_state import RATER_PREFIX, is_our_rater, read_state
from potato_queue.config import ProjectConfig
from potato_queue.errors import Conflict
from potato_queue.insight.agreement import AGREEMENT_KINDS, run_agreement
from potato_queue.runs.finalize import read_predictions
from potato_queue.runs.gate import held_out_ids, label_of, schema_kinds
from potato_queue.runs.kept_bundles import kept_bundle, no_copy_left
from potato_queue.schemes import stored_field, stored_under
from potato_queue.store import RunStore
from potato_queue.wire.files import write_atomic
from potato_queue.wire.text import slug

__all__ = [
    "rater_id",
    "rater_state",
    "become_rater",
    "remove_rater",
    "beside_the_annotators",
    "rater_runs",
    "HELD_OUT_NOTE",
]

LLM_TRAINERS = ("hf-llm-lora",)
ORIGIN_TOOL = "potato-queue"
HELD_OUT_NOTE = "on the run's held-out items only (val and test), never its own train split"


def rater_id(trainer: str, schemas: list[str]) -> str:
    """The rater's user id and folder: one per trainer and set of schemes."""
    return f"{RATER_PREFIX}{slug(trainer)}.{'+'.join(slug(s) for s in sorted(schemas))}"


def _entries(schema: str, kind: str, label: Any, scheme: Mapping[str, Any] | None = None) -> list[list[Any]]:
    """Potato's label-list encoding of one answer, in the shape the scheme's type stores it: a radio or likert
    answer is its label's name, twice; a type that stores its answer under a fixed name (a pairwise
    "selection", a triage "decision", a multirate row's row name under its multirate) has it there."""
    labels = label if kind == "multilabel" and isinstance(label, list) else [label]
    field = stored_field(scheme) if scheme is not None else None
    if field is not None and scheme is not None:
        value = ",".join(str(name) for name in labels if name is not None)
        return [[{"schema": stored_under(scheme), "name": field}, value]] if value else []
    return [[{"schema": schema, "name": str(name)}, str(name)] for name in labels if name is not None]


def rater_state(
    record: Mapping[str, Any],
    predictions: list[dict[str, Any]],
    held_out: set[str],
    kinds: Mapping[str, str],
    schemes: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The rater's user_state.json: Potato's fields for its answers and an `origin` of kind tool (llm for an LLM
    trainer), naming the model, its version and the run."""
    answers: dict[str, list[list[Any]]] = {}
    for p in predictions:
        iid, schema = str(p.get("instance_id")), str(p.get("schema_name"))
        kind = kinds.get(schema, "nominal")
        if iid in held_out and schema in record["schemas"] and kind in AGREEMENT_KINDS:  # the kinds compared as labels
            answers.setdefault(iid, []).extend(_entries(schema, kind, label_of(p), (schemes or {}).get(schema)))
    user = rater_id(str(record["trainer"]), list(record["schemas"]))
    params = record.get("params") or {}
    origin = {
        "kind": "llm" if record["trainer"] in LLM_TRAINERS else "tool",
        "id": user,
        "declared_in": ORIGIN_TOOL,
        "tool": ORIGIN_TOOL,
        "model": str(params.get("model_name") or record["trainer"]),
        "version": str(record.get("model_version") or record["run_id"]),
        "run_date": str(record.get("finished_at") or _now()),
        "run_id": record["run_id"],
        "description": f"run {record['run_id']} ({record['trainer']}), {HELD_OUT_NOTE}",
        "recorded_at": _now(),
    }
    ordering = sorted(a for a in answers if answers[a])
    return {
        "user_id": user,
        "instance_id_ordering": ordering,
        "instance_id_to_label_to_value": {iid: answers[iid] for iid in ordering},
        "instance_id_to_span_to_value": {},
        "origin": origin,
    }


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def become_rater(
    config: ProjectConfig, store: RunStore, record: Mapping[str, Any], predictions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Write a succeeded run's rater (replacing the older run's of the same trainer and schemes) from its
    `predictions` (read from the run's file when not given); what the run's record keeps of it: {id, items,
    replaced}."""
    run_id = record["run_id"]
    paths = store.paths(run_id)
    source = kept_bundle(store, record)  # its held-out items: pruned, a kept run's copy of its bundle
    if source is None:
        raise no_copy_left(store, record, "so no rater is written (Potato's rater is left as it was)")
    if predictions is None:
        predictions, _ = read_predictions(paths.predictions)
    schemes = {str(s.get("name")): s for s in config.annotation_schemes}
    bundle_dir = source.bundle_dir
    state = rater_state(record, predictions, held_out_ids(bundle_dir), schema_kinds(bundle_dir), schemes)
    folder = config.output_path / state["user_id"]
    before = _owner(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(folder / "user_state.json", json.dumps(state, indent=1))  # the folder is ours: no staging
    said = f"a machine rater in Potato as {state['user_id']}: {len(state['instance_id_ordering'])} held-out items"
    store.log(run_id, said + (f" (replacing run {before}'s answers)" if before and before != run_id else ""))
    return {"id": state["user_id"], "items": len(state["instance_id_ordering"]), "replaced": before}


def rater_runs(config: ProjectConfig) -> set[str]:
    """The runs whose answers the project's machine raters hold (what retention must keep)."""
    return {run for folder in config.output_path.glob(RATER_PREFIX + "*") if (run := _owner(folder))}


def _owner(folder: Path) -> str | None:
    """The run whose answers a rater folder holds, None without one."""
    path = folder / "user_state.json"
    if not path.is_file():
        return None
    origin = read_state(path).get("origin")
    return str(origin.get("run_id")) if isinstance(origin, Mapping) and origin.get("run_id") else None


def remove_rater(config: ProjectConfig, store: RunStore, record: Mapping[str, Any]) -> str:
    """Take a run's rater out of Potato (its folder, every answer of it); the rater's id. Conflict when the
    run's answers are not the rater's (never written, removed, or replaced by a newer run's)."""
    run_id = record["run_id"]
    user = rater_id(str(record["trainer"]), list(record["schemas"]))
    folder = config.output_path / user
    owner = _owner(folder)
    if owner != run_id or not is_our_rater(folder.name):
        now = f"run {owner}'s" if owner else "no run's"
        raise Conflict(
            f"Run {run_id} is not a machine rater in Potato: {user} holds {now} answers",
            fix=f"to take the rater out, remove run {owner}'s (training rater {owner} --remove)"
            if owner
            else "nothing to remove; a succeeded run becomes one with `training rater RUN`",
        )
    shutil.rmtree(folder)
    store.log(run_id, f"removed as a machine rater from Potato ({user}): every answer of it is gone")
    return user


def beside_the_annotators(
    config: ProjectConfig, store: RunStore, record: Mapping[str, Any], log: Callable[[str], None]
) -> dict[str, Any]:
    """A succeeded run as one more rater: its agreement with the annotators (the record's `agreement`), and with
    model_training.machine_annotator its held-out answers as a machine rater in Potato (`machine_annotator`).
    Either failing is said in run.log; the run stands."""
    paths = store.paths(record["run_id"])
    predictions, _ = read_predictions(paths.predictions)  # once, for both

    def agreement() -> dict[str, Any]:
        found = run_agreement(config, paths.bundle_dir, predictions)
        for schema, figures in found.items():
            log(f"{schema}: {figures['said']}")
        return found

    steps: list[tuple[str, str, Callable[[], Any]]] = [("agreement", "its agreement with the annotators", agreement)]
    if config.model_training.machine_annotator.enabled:
        steps.append(
            ("machine_annotator", "a machine rater in Potato", lambda: become_rater(config, store, record, predictions))
        )
    fields: dict[str, Any] = {}
    for name, what, step in steps:
        try:
            fields[name] = step()
        except Exception as exc:  # noqa: BLE001 - the run succeeds all the same; this part is missing, and said so
            log(f"warning: {what} could not be worked out ({type(exc).__name__}: {exc})")
    # `agreement` always (empty: no scheme of the run is compared as labels): a record that lacks it is an earlier
    # version's (runs/upgrades.py).
    return {name: value for name, value in fields.items() if value or name == "agreement"}

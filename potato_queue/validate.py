"""Checking a project config (VAL-1..4 in docs/requirements.md) and refusing to start on errors.

`check_file` returns a `Report` (errors, warnings, acknowledged) and never
raises for a problem in the config itself; `load_checked` is what every entry
point calls: it raises `ConfigError` on errors, prints the warnings, and
returns the typed config.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ValidationError

from potato_queue.config import (
    BACKEND_MODELS,
    LOCAL,
    AutoRetrainConfig,
    ModelTrainingConfig,
    ProjectConfig,
    WritebackConfig,
    build_config,
    data_file_paths,
    read_yaml,
)
from potato_queue.errors import ConfigError
from potato_queue.potato_hook import TRAINER_NAME as POTATO_SCHEDULES
from potato_queue.settings import DEFAULT_SETTINGS, Settings
from potato_queue.store.potato_compat import ledger_status
from potato_queue.validate_backends import (
    SLURM_ONLY_REFUSED,
    Warning_,
    check_local_run_keys,
    check_secret_env,
    check_slurm_dir,
    check_slurm_time,
    slurm_time_s,
)

__all__ = ["Warning_", "Report", "check_data", "check_file", "load_checked", "slurm_time_s"]

MIN_ACK_CHARS = 12


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    config: ProjectConfig | None = None

    def ok(self, strict: bool = False) -> bool:
        return not self.errors and not (strict and self.warnings)

    def as_json(self) -> dict[str, list[str]]:
        return {"errors": self.errors, "warnings": self.warnings, "acknowledged": self.acknowledged}


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; valid keys: {', '.join(sorted(valid))}"


def _model_keys(model: type[BaseModel]) -> list[str]:
    return [name for name in model.model_fields if name != "config_path"]


def _unknown_keys(section: dict[str, Any], valid: list[str], path: str, what: str) -> list[str]:
    return [f"{path}.{key}: unknown key {what}{_suggest(str(key), valid)}" for key in section if key not in valid]


def _mapping(value: Any, path: str, errors: list[str]) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        errors.append(f"{path} must be a mapping of keys, not {type(value).__name__} ({value!r})")
        return None
    return value


def _check_backend(name: str, raw: Any, errors: list[str], warnings: list[Warning_]) -> dict[str, Any] | None:
    """Key-level checks of one backend entry; the entry to type-check, or None."""
    path = f"model_training.backends.{name}"
    if name == LOCAL:
        errors.append(f"{path}: 'local' is built in and needs no entry; give this backend another name")
        return None
    entry = _mapping(raw, path, errors)
    if entry is None:
        if raw is None:
            errors.append(f"{path} is empty; give it at least `type: ssh`, `type: slurm` or `type: agent`")
        return None
    kind = entry.get("type")
    if kind not in BACKEND_MODELS:
        got = "missing" if kind is None else f"{kind!r}"
        hint = _suggest(str(kind), list(BACKEND_MODELS)) if kind is not None else ""
        errors.append(f"{path}.type is {got}; it must be ssh, slurm or agent (local needs no entry){hint}")
        return None
    valid = _model_keys(BACKEND_MODELS[kind])
    structural = False
    for key in entry:
        if kind == "slurm" and key in SLURM_ONLY_REFUSED:
            errors.append(f"{path}.{key}: {SLURM_ONLY_REFUSED[key]}")
        elif key not in valid:
            errors.append(f"{path}.{key}: unknown key for a {kind} backend{_suggest(str(key), valid)}")
    if kind in ("ssh", "slurm") and not entry.get("host"):
        errors.append(f"{path}.host is required for a {kind} backend (any name `ssh <host> true` accepts)")
        structural = True
    if kind == "slurm":
        structural |= check_slurm_dir(path, entry.get("remote_dir"), errors)
        check_slurm_time(name, entry.get("time"), errors, warnings)
    check_secret_env(name, entry, warnings)
    # Unknown keys are reported above; the rest is still type-checked so one
    # pass shows every problem. Without host/remote_dir there is nothing to check.
    return None if structural else {k: v for k, v in entry.items() if k in valid}


def _check_sections(data: dict[str, Any], errors: list[str], warnings: list[Warning_]) -> dict[str, Any]:
    """Unknown keys in the sections potato-queue owns; the mapping to type-check.

    Potato's own top-level keys are many and not ours to police, so only
    `model_training` (and its sections) and `validation` are checked key by key.
    """
    clean = dict(data)
    mt = _mapping(data.get("model_training"), "model_training", errors)
    if mt is None:
        clean.pop("model_training", None)
        return clean
    mt = dict(mt)
    errors.extend(_unknown_keys(mt, _model_keys(ModelTrainingConfig), "model_training", "in model_training"))
    for name, model in (("writeback", WritebackConfig), ("auto_retrain", AutoRetrainConfig)):
        sub = _mapping(mt.get(name), f"model_training.{name}", errors)
        if sub is not None:
            errors.extend(_unknown_keys(sub, _model_keys(model), f"model_training.{name}", f"in {name}"))
    check_local_run_keys(mt, warnings)
    backends = _mapping(mt.get("backends"), "model_training.backends", errors) or {}
    checked = {}
    for name, raw in backends.items():
        entry = _check_backend(str(name), raw, errors, warnings)
        if entry is not None:
            checked[str(name)] = entry
    mt["backends"] = checked
    clean["model_training"] = {k: v for k, v in mt.items() if k in ModelTrainingConfig.model_fields}
    return clean


def _loc_path(loc: tuple[Any, ...]) -> str:
    parts = list(loc)
    # A discriminated union puts the backend's type in the location; users
    # never wrote it, so it is left out of the path they read.
    if parts[:2] == ["model_training", "backends"] and len(parts) > 3 and parts[3] in BACKEND_MODELS:
        del parts[3]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _type_errors(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        # A validator of ours may name the value itself; it is said once.
        got = "" if err["type"] == "missing" or "(got " in msg else f" (got {err['input']!r})"
        out.append(f"{_loc_path(err['loc'])}: {msg}{got}")
    return out


def _check_retrain_trainer(retrain: dict[str, Any], errors: list[str]) -> None:
    """An enabled auto-retrain needs a trainer that exists: else every beat tick would fail the same way."""
    from potato_queue.trainers import trainer_names

    trainer, names = retrain.get("trainer"), [*trainer_names(), POTATO_SCHEDULES]
    if retrain.get("enabled") is True and not trainer:
        errors.append(
            f"model_training.auto_retrain.trainer is missing: auto-retrain is enabled and needs one "
            f"(trainers: {', '.join(names)})"
        )
    elif trainer and str(trainer) not in names:
        close = difflib.get_close_matches(str(trainer), names, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        errors.append(
            f"model_training.auto_retrain.trainer is {trainer!r}, which is no trainer "
            f"(trainers: {', '.join(names)}){hint}"
        )


def _raw_mapping(value: Any) -> dict[str, Any]:
    """A mapping of the raw config, or {} where the config has something else (its own error says so)."""
    return value if isinstance(value, dict) else {}


def _check_retrain_schedulers(data: dict[str, Any], warnings: list[Warning_]) -> None:
    """Potato 2.12's own scheduler acts on the same block whenever it has a trainer and schemas."""
    mt = _raw_mapping(data.get("model_training"))
    retrain = _raw_mapping(mt.get("auto_retrain"))
    if (
        retrain.get("enabled") is True
        and retrain.get("schemas")
        and retrain.get("trainer") not in (None, POTATO_SCHEDULES)
    ):
        warnings.append(
            Warning_(
                f"model_training.auto_retrain names both a trainer ({retrain['trainer']}) and schemas, so Potato's own "
                "server retrains on it too (locally, or failing on a trainer it lacks) while potato-queue's beat does; "
                f"leave auto_retrain.schemas out (beat then trains every trainable schema, and Potato's scheduler stays "
                f"idle), or set auto_retrain.trainer: {POTATO_SCHEDULES} so that Potato schedules and potato-queue runs"
            )
        )


def _check_unshown_writeback(data: dict[str, Any], warnings: list[Warning_]) -> None:
    """writeback.schemas naming a scheme Potato pre-fills nothing from: its predictions are stored only."""
    from potato_queue.runs.gate import potato_cannot_show

    listed = _raw_mapping(_raw_mapping(data.get("model_training")).get("writeback")).get("schemas")
    by_name = {str(s.get("name")): s for s in data.get("annotation_schemes") or [] if isinstance(s, dict)}
    for name in (str(x) for x in listed if str(x) in by_name) if isinstance(listed, list) else ():
        why = potato_cannot_show(by_name[name])
        if why:
            warnings.append(
                Warning_(
                    f"model_training.writeback.schemas names {name!r}, and {why}: its predictions "
                    f"are stored (Potato's store, the run's predictions) but never published"
                )
            )


def _check_references(data: dict[str, Any], config_path: str | os.PathLike[str], errors: list[str]) -> None:
    """Names that must point at something: backends, schemes, data files (read from the raw mapping,
    so a reference is checked even when a backend entry has errors of its own)."""
    mt = _raw_mapping(data.get("model_training"))
    backends = _raw_mapping(mt.get("backends"))
    names = [LOCAL, *(str(n) for n in backends if n != LOCAL)]
    retrain = _raw_mapping(mt.get("auto_retrain"))
    for path, value in (
        ("model_training.backend", mt.get("backend")),
        ("model_training.auto_retrain.backend", retrain.get("backend")),
    ):
        if value is not None and value not in names:
            close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            errors.append(f"{path} is {value!r}, which names no backend (configured: {', '.join(names)}){hint}")
    _check_retrain_trainer(retrain, errors)
    schemes = [str(s.get("name")) for s in data.get("annotation_schemes") or [] if isinstance(s, dict)]
    writeback = _raw_mapping(mt.get("writeback"))
    for path, listed in (
        ("model_training.writeback.schemas", writeback.get("schemas")),
        ("model_training.auto_retrain.schemas", retrain.get("schemas")),
    ):
        for schema in listed if isinstance(listed, list) else []:
            if str(schema) not in schemes:
                errors.append(
                    f"{path} names {schema!r}, which is not an annotation scheme (schemes: {', '.join(schemes) or 'none'})"
                )
    task_dir = Path(config_path).resolve().parent / os.path.expanduser(str(data.get("task_dir") or "."))
    for index, raw in enumerate(data_file_paths(data.get("data_files") or [])):
        data_path = task_dir / os.path.expanduser(raw)
        if not data_path.exists():
            errors.append(f"data_files[{index}] is {raw!r}, which does not exist (looked for {data_path.resolve()})")


def _named_backends(entry: str, names: list[str]) -> set[str]:
    return {n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", entry)}


def _acknowledge(raw: Any, found: list[Warning_], backends: list[str], report: Report) -> None:
    """Split warnings into acknowledged and not (VAL-4); bad entries warn themselves."""
    entries = raw if isinstance(raw, list) else []
    if raw is not None and not isinstance(raw, list):
        report.errors.append(f"validation.acknowledge must be a list of warning texts, not {type(raw).__name__}")
    matched: set[int] = set()
    for entry in entries:
        if not isinstance(entry, str) or len(entry) < MIN_ACK_CHARS:
            report.warnings.append(
                f"validation.acknowledge entry {entry!r} is shorter than {MIN_ACK_CHARS} characters; "
                "quote more of the warning it acknowledges"
            )
            continue
        named = _named_backends(entry, backends)
        hits = [i for i, w in enumerate(found) if entry in w.text and (not named or w.backend in named)]
        if not hits:
            report.warnings.append(f"validation.acknowledge entry {entry!r} matches no warning; remove it")
        matched.update(hits)
    for i, w in enumerate(found):
        (report.acknowledged if i in matched else report.warnings).append(w.text)


# The tutorial's example key: anyone who read it knows it.
PLACEHOLDER_KEYS = frozenset({"change-me", "changeme", "change_me", "secret", "admin"})
MIN_ADMIN_KEY_CHARS = 12


def is_weak_admin_key(key: Any) -> bool:
    return isinstance(key, str) and (key.strip().lower() in PLACEHOLDER_KEYS or len(key.strip()) < MIN_ADMIN_KEY_CHARS)


def _check_admin_key(key: Any, warnings: list[Warning_]) -> None:
    if key is not None and is_weak_admin_key(key):
        warnings.append(
            Warning_(
                f"admin_api_key is {key!r}, a placeholder or shorter than {MIN_ADMIN_KEY_CHARS} characters, which "
                "anyone can guess; set a real key (e.g. the output of: python -c 'import secrets; "
                "print(secrets.token_urlsafe(24))'), or leave it out and set POTATO_ADMIN_API_KEY"
            )
        )


def check_data(data: dict[str, Any], config_path: str | os.PathLike[str]) -> Report:
    """Every VAL rule over a parsed config mapping, all problems in one pass."""
    report = Report()
    validation = _mapping(data.get("validation"), "validation", report.errors)
    if validation is not None:
        report.errors.extend(_unknown_keys(validation, ["acknowledge"], "validation", "in validation"))
    found: list[Warning_] = []
    clean = _check_sections(data, report.errors, found)
    _check_admin_key(data.get("admin_api_key"), found)
    _check_retrain_schedulers(data, found)
    _check_unshown_writeback(data, found)
    _check_references(data, config_path, report.errors)
    backends = list(clean.get("model_training", {}).get("backends", {}))
    _acknowledge((validation or {}).get("acknowledge"), found, backends, report)
    try:
        cfg = build_config(clean, config_path)
    except ValidationError as exc:
        report.errors.extend(_type_errors(exc))
        return report
    if not report.errors:
        _check_retrain_fit(cfg, report.errors)
    if not report.errors:
        report.config = cfg
    return report


def _check_retrain_fit(config: ProjectConfig, errors: list[str]) -> None:
    """An auto_retrain trainer that cannot train what it is given: auto_retrain.schemas of a kind it does not
    declare, or items of a modality it does not (a text trainer on images); every auto run would be refused."""
    from potato_queue.bundle import project_modality, schema_kind
    from potato_queue.trainers import trainer_info, trainers_for_modality

    retrain = config.model_training.auto_retrain
    info = trainer_info(str(retrain.trainer)) if retrain.enabled and retrain.trainer else None
    if info is None:
        return
    modality = project_modality(config, list(retrain.schemas) or None)
    by_name = {str(s.get("name")): s for s in config.annotation_schemes}
    for name in (n for n in retrain.schemas if n in by_name):
        kind = schema_kind(by_name[name])
        if kind not in info.kinds:
            takers = trainers_for_modality(kind, modality)
            errors.append(
                f"model_training.auto_retrain.schemas names {name!r}, which is {kind}, and its trainer "
                f"{info.name} trains only {'/'.join(info.kinds)} schemes: every auto run would be refused; "
                + (f"train it with {' or '.join(takers)}" if takers else f"leave {name} out")
            )
    if modality not in info.modalities:
        errors.append(
            f"model_training.auto_retrain.trainer is {info.name}, which trains on "
            f"{'/'.join(info.modalities)} items, and this project's items are of the {modality} "
            f"modality: every auto run would be refused; pick a trainer that takes {modality} items"
        )


def check_file(path: str | os.PathLike[str]) -> Report:
    """The report for a config file; ConfigUnreadable (exit 2) if it cannot be parsed."""
    return check_data(read_yaml(path), path)


def load_checked(
    path: str | os.PathLike[str],
    *,
    stream: TextIO | None = None,
    say_writeback: bool = False,
    settings: Settings = DEFAULT_SETTINGS,
) -> ProjectConfig:
    """What every entry point calls: refuse to start on errors, print warnings (VAL-2); a long-running
    process (`say_writeback`) also says once whether runs reach Potato's own store. The config carries
    `settings`, the process's, read from its environment at its edge."""
    report = check_file(path)
    if report.errors:
        raise ConfigError(str(path), report.errors)
    out = stream if stream is not None else sys.stderr
    # `up` prints them once and starts its server and executor with this set, so they do not repeat them.
    if settings.warnings_shown_for != str(Path(path).resolve()):
        for text in report.warnings:
            print(f"warning: {text}", file=out)
        # validation.acknowledge is validate's (--strict passes); a starting process still says them, marked
        for text in report.acknowledged:
            print(f"warning (acknowledged in validation.acknowledge): {text}", file=out)
        if say_writeback and report.config is not None:
            print(ledger_status(report.config).line(), file=out)
    assert report.config is not None
    return report.config.with_settings(settings)

"""Reading and checking a project config (VAL-1..4 in docs/requirements.md), and refusing to start on errors.

`read_yaml` parses the file as YAML 1.2; `check_file` returns a `Report` (errors, warnings, acknowledged)
and never raises for a problem in the config itself; `load_checked` is what every entry point calls: it
raises `ConfigError` on errors, prints the warnings, and returns the typed config. The key-level checks
(unknown keys, backend entries, secrets) are validate_backends.py's; the cross references, the
acknowledgements and the trainer's fit are here.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from potato_queue.config import BACKEND_MODELS, LOCAL, ProjectConfig, build_config, data_file_paths
from potato_queue.errors import ConfigError, ConfigUnreadable
from potato_queue.potato_hook import TRAINER_NAME as POTATO_SCHEDULES
from potato_queue.schemes import refusal_text, with_rows
from potato_queue.settings import DEFAULT_SETTINGS, Settings
from potato_queue.store.potato_compat import ledger_status
from potato_queue.validate_backends import (
    Warning_,
    as_mapping,
    check_admin_key,
    check_sections,
    slurm_time_s,
    unknown_keys,
)

__all__ = ["Warning_", "Report", "read_yaml", "check_data", "check_file", "load_checked", "slurm_time_s"]

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


def _raw_schemes(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The raw config's schemes by name, a multirate's rows among them (schemes.with_rows), as the typed config
    lists them; [] where the config has something else than a list (its own error says so)."""
    raw = data.get("annotation_schemes")
    return {str(s.get("name")): s for s in with_rows(raw if isinstance(raw, list) else []) if isinstance(s, dict)}


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
    by_name = _raw_schemes(data)
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
    budget = _raw_mapping(_raw_mapping(mt.get("budget")).get("backends"))
    for name in budget:
        if str(name) not in names:
            errors.append(
                f"model_training.budget.backends names {name!r}, which is no backend (configured: {', '.join(names)})"
            )
    _check_retrain_trainer(retrain, errors)
    by_name = _raw_schemes(data)
    schemes = list(by_name)
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
            elif refused := refusal_text(by_name[str(schema)]):
                errors.append(f"{path} names {schema!r}: {refused}; leave it out (docs/trainers.md, the type table)")
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


def check_data(data: dict[str, Any], config_path: str | os.PathLike[str]) -> Report:
    """Every VAL rule over a parsed config mapping, all problems in one pass."""
    report = Report()
    validation = as_mapping(data.get("validation"), "validation", report.errors)
    if validation is not None:
        report.errors.extend(unknown_keys(validation, ["acknowledge"], "validation", "in validation"))
    found: list[Warning_] = []
    clean = check_sections(data, report.errors, found)
    check_admin_key(data.get("admin_api_key"), found)
    _check_retrain_schedulers(data, found)
    _check_unshown_writeback(data, found)
    _check_references(data, config_path, report.errors)
    backends = list(clean.get("model_training", {}).get("backends", {}))
    try:
        cfg: ProjectConfig | None = build_config(clean, config_path)
    except ValidationError as exc:
        cfg = None
        report.errors.extend(_type_errors(exc))
    items = None
    if cfg is not None and not report.errors:
        from potato_queue.bundle.item_keys import check_items  # numpy's import, only for a config worth it

        checked = check_items(cfg)  # the data files against id_key and text_key, as a run's bundle reads them
        report.errors.extend(checked.errors)
        found.extend(Warning_(text) for text in checked.warnings)
        items = checked.items
    _acknowledge((validation or {}).get("acknowledge"), found, backends, report)
    if cfg is None:
        return report
    if not report.errors:
        _check_retrain_fit(cfg, report.errors, items)
    if not report.errors:
        report.config = cfg
    return report


def _check_retrain_fit(config: ProjectConfig, errors: list[str], items: dict[str, Any] | None) -> None:
    """An auto_retrain trainer that cannot train what it is given: auto_retrain.schemas of a kind it does not
    declare, or items of a modality it does not (a text trainer on images); every auto run would be refused."""
    from potato_queue.bundle import project_modality, schema_kind
    from potato_queue.trainers import trainer_info, trainers_for_modality

    retrain = config.model_training.auto_retrain
    info = trainer_info(str(retrain.trainer)) if retrain.enabled and retrain.trainer else None
    if info is None:
        return
    modality = project_modality(config, list(retrain.schemas) or None, items)
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


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 numbers.

    PyYAML reads an unquoted `time: 12:00:00` as the integer 43200, which
    sbatch would take as 43200 minutes. YAML 1.2 (and every admin) reads it
    as the text "12:00:00".
    """


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse the config file; ConfigUnreadable (exit 2) when that is impossible."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigUnreadable(f"{path} does not exist", fix="give the path of the project's config.yaml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigUnreadable(f"{path} cannot be read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigUnreadable(
            f"{path} is not valid YAML{where}: {exc.problem}",
            fix="correct the YAML syntax there (indentation, a missing colon or quote)",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigUnreadable(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigUnreadable(
            f"{path} is not a Potato config: its top level is {type(data).__name__}, not a mapping of keys",
            fix="a Potato config starts with keys like annotation_task_name: and task_dir:",
        )
    return data


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

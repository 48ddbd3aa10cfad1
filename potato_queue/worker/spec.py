"""spec.json: what one run is asked to do (Potato's worker spec, v1).

``{"v": 1, "run_id", "trainer", "schemas": [{name, annotation_type, kind,
labels, source_field}], "bundle_dir", "workdir", "params": {...}, "seed",
"limits": {"max_wall_s", "max_ram_mb", "device", "num_threads"}}``, and ours beyond
Potato's: an optional ``checkpoint_dir`` (default: ``checkpoints/`` beside the workdir).

Relative ``bundle_dir`` and ``workdir`` are taken relative to the folder
holding spec.json. Anything malformed raises :class:`SpecError` (exit 2).
"""

import os
from typing import Any, Dict, List, Optional, Tuple

from potato_queue.wire.files import read_json
from potato_queue.wire.job import SPEC_VERSION, Limits

from .errors import SpecError

__all__ = ["SchemaSpec", "Limits", "Spec", "load_spec", "parse_spec", "with_bundle_schemas"]


class SchemaSpec:
    """One annotation scheme as the trainer sees it."""

    def __init__(
        self,
        name: str,
        kind: str,
        annotation_type: str = "",
        labels: Tuple[str, ...] = (),
        source_field: Optional[str] = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.annotation_type = annotation_type
        self.labels = labels
        self.source_field = source_field

    def __repr__(self) -> str:
        return "SchemaSpec(%r, kind=%r)" % (self.name, self.kind)


class Spec:
    """A parsed, checked spec.json."""

    def __init__(
        self,
        run_id: str,
        trainer: str,
        schemas: List[SchemaSpec],
        bundle_dir: str,
        workdir: str,
        params: Dict[str, Any],
        seed: int = 0,
        limits: Optional[Limits] = None,
        checkpoint_dir: Optional[str] = None,
        gpus: Optional[str] = None,
    ) -> None:
        self.run_id = run_id
        self.trainer = trainer
        self.schemas = schemas
        self.bundle_dir = bundle_dir
        self.workdir = workdir
        self.params = params
        self.seed = seed
        self.limits = limits or Limits()
        self.checkpoint_dir = checkpoint_dir
        self.gpus = gpus  # the GPUs (nvidia-smi's indexes) the agent gave this run, or None: the environment's


def _string(data: Dict[str, Any], key: str, where: str = "spec") -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SpecError("%s.%s must be a non-empty string, got %r" % (where, key, value))
    return value


def _optional_number(data: Dict[str, Any], key: str, integer: bool) -> Any:
    value = data.get(key)
    if value is None or (value == 0 and not isinstance(value, bool)):
        return None  # Potato writes 0 for "no limit" too
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise SpecError("spec.limits.%s must be a positive number or null, got %r" % (key, value))
    if integer and value != int(value):
        raise SpecError("spec.limits.%s must be a whole number, got %r" % (key, value))
    return int(value) if integer else value


def _parse_schema(index: int, raw: Any) -> SchemaSpec:
    where = "spec.schemas[%d]" % index
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise SpecError("%s must be an object, got %r" % (where, raw))
    labels = raw.get("labels") or []
    if not isinstance(labels, list):
        raise SpecError("%s.labels must be a list" % where)
    source_field = raw.get("source_field")
    return SchemaSpec(
        name=_string(raw, "name", where),
        kind=str(raw.get("kind") or ""),  # "": the bundle says (with_bundle_schemas)
        annotation_type=str(raw.get("annotation_type") or ""),
        labels=tuple(str(label.get("name") if isinstance(label, dict) else label) for label in labels),
        source_field=None if source_field is None else str(source_field),
    )


def with_bundle_schemas(schemas: List[SchemaSpec], described: Any) -> List[SchemaSpec]:
    """The spec's schemes as the bundle's manifest describes them (kind, annotation type, labels), where the
    spec only names them, as the server's job does. A scheme the bundle does not describe keeps no kind,
    which no trainer declares: it is refused, never taken for nominal."""
    by_name = {str(s.get("name")): s for s in described or [] if isinstance(s, dict)}
    return [
        _parse_schema(index, by_name[schema.name]) if not schema.kind and schema.name in by_name else schema
        for index, schema in enumerate(schemas)
    ]


def _parse_limits(raw: Any) -> Limits:
    if raw is None:
        return Limits()
    if not isinstance(raw, dict):
        raise SpecError("spec.limits must be an object, got %r" % (raw,))
    device = raw.get("device") or "auto"
    if not isinstance(device, str):
        raise SpecError("spec.limits.device must be a string, got %r" % (device,))
    return Limits(
        max_wall_s=_optional_number(raw, "max_wall_s", integer=False),
        max_ram_mb=_optional_number(raw, "max_ram_mb", integer=True),
        device=device.strip(),
        num_threads=_optional_number(raw, "num_threads", integer=True),
    )


def _gpus(value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not all(part.strip().isdigit() for part in value.split(",")):
        raise SpecError('spec.gpus must be GPU indexes like "1" or "0,1", got %r' % (value,))
    return value


def _resolve(path: str, base_dir: str) -> str:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))


def parse_spec(data: Any, base_dir: str = ".") -> Spec:
    """Check a decoded spec.json and build a :class:`Spec`."""
    if not isinstance(data, dict):
        raise SpecError("spec.json must hold a JSON object, got %s" % type(data).__name__)
    version = data.get("v", SPEC_VERSION)
    if version != SPEC_VERSION:
        raise SpecError("spec.json is version %r; this worker reads version %d" % (version, SPEC_VERSION))
    schemas = data.get("schemas")
    if not isinstance(schemas, list) or not schemas:
        raise SpecError("spec.schemas must be a non-empty list")
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise SpecError("spec.params must be an object, got %r" % (params,))
    seed = data.get("seed", 0)
    if seed is None:
        seed = 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SpecError("spec.seed must be an integer, got %r" % (seed,))
    parsed = [_parse_schema(i, raw) for i, raw in enumerate(schemas)]
    names = [schema.name for schema in parsed]
    if len(set(names)) != len(names):
        raise SpecError("spec.schemas names a schema twice: %s" % ", ".join(names))
    return Spec(
        run_id=_string(data, "run_id"),
        trainer=_string(data, "trainer"),
        schemas=parsed,
        bundle_dir=_resolve(_string(data, "bundle_dir"), base_dir),
        workdir=_resolve(_string(data, "workdir"), base_dir),
        params=params,
        seed=seed,
        limits=_parse_limits(data.get("limits")),
        checkpoint_dir=_resolve(_string(data, "checkpoint_dir"), base_dir) if "checkpoint_dir" in data else None,
        gpus=_gpus(data.get("gpus")),
    )


def load_spec(path: str) -> Spec:
    """Read and check spec.json at *path*."""
    data = read_json(path, "the spec " + path, SpecError)
    return parse_spec(data, os.path.dirname(os.path.abspath(path)))

"""A project's annotation schemes as potato-queue reads them: every Potato annotation type, its kind by
Potato's rule, what its answer stores, whether a run trains it (annotation_types.py). Imports nothing of
ours, so the config (which lists a multirate's rows as schemes of their own) can read it."""

from potato_queue.schemes.annotation_types import (
    ROW_OF,
    SCHEMA_TYPES,
    SCHEME_NAME,
    SchemaType,
    kind_of_type,
    pairwise_mode,
    refusal,
    refusal_text,
    stored_field,
    stored_under,
    with_rows,
)

__all__ = [
    "ROW_OF",
    "SCHEMA_TYPES",
    "SCHEME_NAME",
    "SchemaType",
    "kind_of_type",
    "pairwise_mode",
    "refusal",
    "refusal_text",
    "stored_field",
    "stored_under",
    "with_rows",
]

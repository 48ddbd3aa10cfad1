"""The items against the config's item keys, before any run: what `validate` says of the data files.

Potato refuses a data file whose items lack the id field, an empty id or an id used twice (read.py raises
those as it reads); it only warns when the text field is missing, and a run would then train on empty
texts (scikit-learn's `empty vocabulary`, a fine-tune on nothing). So a `text_key` no item has is an error
here, naming the key, the file and the fields a sample item does have, unless the items are media (an
image item needs no text); most texts empty is a warning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from potato_queue.bundle.data_files import DataFileError
from potato_queue.bundle.modality import item_media, item_pair, item_text, media_source
from potato_queue.bundle.read import read_items
from potato_queue.config import ProjectConfig
from potato_queue.schemes import pair_key

__all__ = ["ItemCheck", "check_items"]

_FIELDS_SHOWN = 8


class ItemCheck:
    """What the items say: errors (no run could train) and warnings (runs would train on little); the items,
    where they could be read (validate's other checks read them from here, not from the files again)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.items: dict[str, dict[str, Any]] | None = None


def _fields(item: Mapping[str, Any]) -> str:
    names = list(map(str, item))
    return ", ".join(names[:_FIELDS_SHOWN]) + (" ..." if len(names) > _FIELDS_SHOWN else "")


def check_items(config: ProjectConfig) -> ItemCheck:
    """Read every data file as a bundle would, and judge the text field against the items."""
    check = ItemCheck()
    if not config.data_paths():
        return check
    try:
        items = check.items = read_items(config)
    except DataFileError as exc:
        check.errors.append(f"{exc.message}; fix: {exc.fix}" if exc.fix else exc.message)
        return check
    if not items:
        return check
    text_key = config.item_properties.text_key
    source, _ = media_source(config, config.annotation_schemes)
    with_media = sum(1 for item in items.values() if item_media(item, source))
    pairs = {key for scheme in config.annotation_schemes if (key := pair_key(scheme))}
    with_pair = sum(1 for item in items.values() if any(item_pair(item, key) for key in pairs))
    if max(with_media, with_pair) >= len(items) / 2:
        return check  # media items, or pairs to compare: the text field is optional
    empty = sum(1 for item in items.values() if not item_text(item, text_key).strip())
    sample = next(iter(items.values()))
    first_file = os.path.relpath(config.data_paths()[0], config.config_path.parent)
    if not any(text_key in item for item in items.values()):
        check.errors.append(
            f"item_properties.text_key is {text_key!r}, and no item of the data files has that field (the first "
            f"item of {first_file} has {_fields(sample)}): every run would train on empty texts; set "
            f"item_properties.text_key to the field that holds the text"
        )
    elif empty > len(items) / 2:
        check.warnings.append(
            f"{empty} of {len(items)} items have an empty {text_key!r} (item_properties.text_key): runs learn from "
            f"the others only; check that text_key names the field that holds the text"
        )
    return check

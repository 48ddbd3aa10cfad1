"""What a project's items are (text, image, ...) and which field names an item's media, as Potato decides it
(`training/dataset.py`'s detect_modality), and where Potato's own page says more than that rule sees.

Potato's rule: a scheme type that implies a modality (image_annotation: image), else images when 80% of the
labelled rows name an image file by its extension (a remote one only where the item shows nothing else),
else text. Two cases users have that the rule misses, both read here as images: a field Potato's page shows
with `type: image` (`instance_display.fields`), and a web address without an extension on an item that
shows nothing else (Potato's image example: `https://images.unsplash.com/photo-...?w=800`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from potato_queue.config import ProjectConfig

__all__ = [
    "MEDIA_KEYS",
    "displayed_image_field",
    "is_remote",
    "item_media",
    "item_pair",
    "item_text",
    "items_modality",
    "detect_modality",
    "media_source",
]

Row = dict[str, Any]

#: Item fields that name a media file, in the order Potato looks for them.
MEDIA_KEYS = (
    "image_url",
    "image",
    "image_path",
    "file_name",
    "audio_url",
    "audio",
    "audio_path",
    "video_url",
    "video",
    "video_path",
    "url",
    "path",
)
_MEDIA_KEY_SET = frozenset(MEDIA_KEYS)
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
_MODALITY_BY_TYPE = {
    "image_annotation": "image",
    "region_caption": "image",
    "grounding_eval": "image",
    "audio_annotation": "audio",
    "video_annotation": "video",
    "tiered_annotation": "audio",
    "spatial_annotation": "point_cloud",
    "episode_annotation": "video",
}


def displayed_image_field(config: ProjectConfig) -> str | None:
    """The item field Potato's page shows as an image (the first `instance_display.fields` entry with
    `type: image`), if any."""
    display = (config.model_extra or {}).get("instance_display")
    fields = display.get("fields") if isinstance(display, Mapping) else None
    for entry in fields if isinstance(fields, list) else []:
        if isinstance(entry, Mapping) and str(entry.get("type") or "").lower() == "image" and entry.get("key"):
            return str(entry["key"])
    return None


def media_source(config: ProjectConfig, schemes: Sequence[Mapping[str, Any]]) -> tuple[str | None, bool]:
    """(the field that names an item's media before Potato's own keys, whether the page shows it as an image):
    the first scheme's source_field (Potato reads that one only), else the field displayed as an image."""
    source = schemes[0].get("source_field") if schemes else None
    shown = displayed_image_field(config)
    return (str(source) if source else shown), bool(shown) and (not source or source == shown)


def item_text(item: Mapping[str, Any], text_key: str) -> str:
    """An item's text as Potato's bundle writes it (a missing or empty field is "")."""
    return str(item.get(text_key, "") or "")


def item_pair(item: Mapping[str, Any], pair_key: str | None) -> list[str] | None:
    """The two texts a pairwise scheme compares (the item's `pair_key` field, a list), or None."""
    found: Any = item.get(pair_key) if pair_key else None
    if hasattr(found, "tolist") and not isinstance(found, str):  # a Parquet list column: a numpy array
        found = found.tolist()
    if isinstance(found, (list, tuple)) and len(found) >= 2:
        return [str(found[0]), str(found[1])]
    return None


def is_remote(reference: str) -> bool:
    """Whether a media reference is a web address (else a path under the project)."""
    return reference.startswith(("http://", "https://"))


def item_media(item: Row, source_field: str | None) -> str | None:
    """The media an item names (its scheme's source_field, else the first of Potato's media keys), if any."""
    if not (source_field and item.get(source_field)) and _MEDIA_KEY_SET.isdisjoint(item):
        return None  # most items: text alone
    return next((str(item[k]) for k in (source_field, *MEDIA_KEYS) if k and item.get(k)), None)


def _names_image(row: Row, shown_as_image: bool) -> bool:
    ref = str(row.get("media") or row.get("media_missing") or "")
    if not ref:
        return False
    if shown_as_image:
        return True
    text = str(row.get("text") or "").strip()
    # A remote image on an item that shows text does not make the corpus images.
    if is_remote(ref) and text and text != ref:
        return False
    path = ref.lower().split("?")[0].split("#")[0]
    if path.endswith(_IMAGE_SUFFIXES):
        return True
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return is_remote(ref) and "." not in last  # a web address with no extension, on an item that shows only it


def detect_modality(schemes: Sequence[Mapping[str, Any]], rows: Sequence[Row], shown_as_image: bool = False) -> str:
    """From a scheme's type; else images when 80% of labelled rows name an image; else text."""
    for scheme in schemes:
        if scheme.get("annotation_type", "") in _MODALITY_BY_TYPE:
            return _MODALITY_BY_TYPE[scheme["annotation_type"]]
    hits = sum(_names_image(row, shown_as_image) for row in rows)
    return "image" if rows and hits >= 0.8 * len(rows) else "text"


def items_modality(config: ProjectConfig, schemes: Sequence[Mapping[str, Any]], items: Mapping[str, Row]) -> str:
    """The modality a bundle of these schemes would have, from the items alone (nothing linked): Potato's rule
    over every item, where a bundle reads its labelled rows."""
    source, shown = media_source(config, schemes)
    text_key = config.item_properties.text_key
    rows = [{"text": item_text(item, text_key), "media": item_media(item, source)} for item in items.values()]
    return detect_modality(schemes, rows, shown)

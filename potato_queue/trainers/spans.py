"""Span schemes (kind `span`: named entities, highlighted evidence), the parts a token tagger needs.

Potato keeps an annotator's spans as character offsets into the item's text (``start`` inclusive, ``end``
exclusive, the label in ``name``). A token classifier learns one tag per token instead: BIO, ``B-<label>``
on a span's first token, ``I-<label>`` on the rest, ``O`` outside every span; a token is in a span when
their characters overlap. Predictions go back the same way: a run of ``B``/``I`` tokens of one label is
one span, from its first token's start to its last token's end, so a prediction lands on the text's own
characters whatever the tokenizer.

BIO gives a token one tag, so spans that overlap cannot all be learned: of overlapping spans the first
(by start, the longer first) is kept and the others are left out of training, counted, and said in
run.log with an example (`drop_overlaps`). Pure Python over offsets and lists of floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from potato_queue.wire.span_scores import Span, as_spans
from potato_queue.worker.bundle import Bundle

__all__ = ["OUTSIDE", "labelled_spans", "drop_overlaps", "tag_names", "bio_tags", "spans_from_tags"]

OUTSIDE = "O"
SCORE_DIGITS = 4


def labelled_spans(bundle: Bundle, split: str, schema: str) -> tuple[list[str], list[list[Span]], list[str]]:
    """``(texts, spans, instance ids)`` of the rows of *split* with at least one span of *schema*."""
    texts: list[str] = []
    spans: list[list[Span]] = []
    ids: list[str] = []
    for row in bundle.read_split(split):
        found = as_spans((row.get("targets") or {}).get(schema))
        if found:
            texts.append(str(row.get("text") or ""))
            spans.append(found)
            ids.append(str(row.get("instance_id")))
    return texts, spans, ids


def drop_overlaps(spans: Sequence[Span]) -> tuple[list[Span], list[tuple[Span, Span]]]:
    """The spans BIO can hold (of overlapping ones the first by start, the longer first) and each one left out
    with the span it overlaps."""
    kept: list[Span] = []
    dropped: list[tuple[Span, Span]] = []
    for span in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]), s[2])):
        clash = next((k for k in kept if k[0] < span[1] and span[0] < k[1]), None)
        if clash is None:
            kept.append(span)
        else:
            dropped.append((span, clash))
    return kept, dropped


def tag_names(labels: Sequence[str]) -> list[str]:
    """The tagger's outputs: O, then B- and I- of each label."""
    return [OUTSIDE] + [f"{edge}-{label}" for label in labels for edge in ("B", "I")]


def bio_tags(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> list[str | None]:
    """Each token's tag from its (start, end) characters; None for a token of no characters (the tokenizer's
    own, such as [CLS]), which the loss leaves out."""
    tags: list[str | None] = []
    started: set[Span] = set()
    for start, end in offsets:
        if end <= start:
            tags.append(None)
            continue
        span = next((s for s in spans if s[0] < end and start < s[1]), None)
        if span is None:
            tags.append(OUTSIDE)
            continue
        tags.append(("I-" if span in started else "B-") + span[2])
        started.add(span)
    return tags


def spans_from_tags(
    offsets: Sequence[tuple[int, int]], rows: Sequence[Sequence[float]], names: Sequence[str]
) -> tuple[list[dict[str, Any]], float | None]:
    """The spans a tagger's per-token probabilities (`rows`, in `names` order) mark, as Potato's span dicts
    ``{start, end, label, confidence}`` (a span's confidence: its least sure token's), and the least sure
    token decision of the text (None when it has no token)."""
    spans: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    least: float | None = None
    for (start, end), row in zip(offsets, rows):  # noqa: B905 - runs on 3.8/3.9
        if end <= start:
            continue
        best = max(range(len(row)), key=row.__getitem__)
        sure = float(row[best])
        least = sure if least is None else min(least, sure)
        edge, _, label = names[best].partition("-")
        if edge == "I" and current is not None and current["label"] == label:
            current["end"], current["confidence"] = end, min(current["confidence"], sure)
            continue
        current = None
        if edge in ("B", "I"):  # an I- with no span before it starts one: the tagger saw its label begin
            current = {"start": start, "end": end, "label": label, "confidence": sure}
            spans.append(current)
    for span in spans:
        span["confidence"] = round(span["confidence"], SCORE_DIGITS)
    return spans, least

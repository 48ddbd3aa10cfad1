"""Span schemes: Potato's character offsets to BIO tags and back, entity scores, and a token tagger trained for
real.

The codings and scores are checked against sums done by hand; hf-token-classification fine-tunes a tiny
BERT built here (on the CPU) through the queue (a real server, Redis, executor and agent on the local
backend, and the ssh backend against a real sshd) on the small reviews project with a span scheme
answered as Potato 2.12.1 stores spans; the prelabels are read back from the real Potato 2.12.1's page.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml

from potato_queue.trainers.spans import bio_tags, drop_overlaps, spans_from_tags, tag_names
from potato_queue.wire.scoring import score
from tests.e2e.ssh.test_ssh_backend import BACKEND, gpu_server
from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, make_project, run_paths, started
from tests.potato_helpers import PotatoAnnotator, PotatoServer, add_potato_keys
from tests.sshd import Sshd

LABELS = ["complaint", "praise", "subject"]
SCHEME = {"annotation_type": "span", "name": "aspects", "description": "Mark what is judged and how", "labels": LABELS}
NEGATIVE = {
    "confusing",
    "tedious",
    "dull",
    "messy",
    "lifeless",
    "clumsy",
    "forgettable",
    "slow",
    "bland",
    "shallow",
    "boring",
    "predictable",
}
REVIEW = re.compile(r"The (?P<subject>.+) was (?P<judged>\w+)\.")


@pytest.mark.unit
def test_spans_become_bio_tags_on_the_tokens_they_overlap_and_come_back_as_characters() -> None:
    text = "The camera work was clever."
    offsets = [(0, 0), (0, 3), (4, 10), (11, 15), (16, 19), (20, 26), (26, 27), (0, 0)]  # [CLS] ... . [SEP]
    spans = [(4, 15, "subject"), (20, 26, "praise")]
    assert bio_tags(offsets, spans) == [None, "O", "B-subject", "I-subject", "O", "B-praise", "O", None]
    names = tag_names(["praise", "subject"])
    assert names == ["O", "B-praise", "I-praise", "B-subject", "I-subject"]
    # One probability row per token: each token's tag is its likeliest; [CLS]/[SEP] have no characters.
    rows = [
        [1, 0, 0, 0, 0],
        [0.9, 0, 0, 0.1, 0],
        [0.1, 0, 0, 0.8, 0.1],
        [0.3, 0, 0, 0, 0.7],
        [0.99, 0, 0, 0, 0.01],
        [0.2, 0.6, 0.2, 0, 0],
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
    ]
    found, least = spans_from_tags(offsets, rows, names)
    assert found == [
        {"start": 4, "end": 15, "label": "subject", "confidence": 0.7},
        {"start": 20, "end": 26, "label": "praise", "confidence": 0.6},
    ]
    assert [text[s["start"] : s["end"]] for s in found] == ["camera work", "clever"] and least == 0.6


@pytest.mark.unit
def test_overlapping_spans_keep_the_first_and_name_the_rest() -> None:
    kept, dropped = drop_overlaps([(4, 12, "complaint"), (0, 8, "praise"), (20, 25, "praise")])
    assert kept == [(0, 8, "praise"), (20, 25, "praise")]
    assert dropped == [((4, 12, "complaint"), (0, 8, "praise"))]


@pytest.mark.unit
def test_entity_scores_match_the_sums_by_hand() -> None:
    gold = {
        "a": [{"start": 0, "end": 4, "name": "subject"}, {"start": 9, "end": 14, "name": "praise"}],
        "b": [{"start": 4, "end": 10, "name": "subject"}],
        "c": [],
    }
    predicted = {
        "a": [{"start": 0, "end": 4, "label": "subject"}, {"start": 9, "end": 12, "label": "praise"}],
        "b": [{"start": 4, "end": 10, "label": "praise"}],
    }
    scores = score(gold, predicted, "span")
    # Exact: 1 right of 3 predicted, of 3 gold (P = R = F1 = 1/3). Partial: a's praise overlaps too (2/3);
    # b's span has the wrong label. subject: tp 1, fp 0, fn 1 (2/3); praise: tp 0 (0). c has no answer.
    assert (scores["precision"], scores["recall"], scores["f1"]) == (0.3333, 0.3333, 0.3333)
    assert (scores["partial_precision"], scores["partial_f1"]) == (0.6667, 0.6667)
    assert scores["per_label_f1"] == {"praise": 0.0, "subject": 0.6667} and scores["macro_f1"] == 0.3333
    assert (scores["accuracy"], scores["n"], scores["n_spans"]) == (0.0, 2, 3)


def test_hf_token_classification_tags_spans_through_the_queue(
    tmp_path: Path, redis_server_url: str, tiny_model: Path
) -> None:
    """A real fine-tune; an overlapping span some annotator drew is left out and said."""
    with spans_stack(tmp_path, redis_server_url) as svc:
        refused = svc.api("POST", "/runs", {"trainer": "sklearn-text", "schemas": ["aspects"]})
        assert refused[0] == 409 and "train aspects with hf-token-classification" in refused[1]["detail"], refused
        run_id = svc.start_run(
            trainer="hf-token-classification",
            schemas=["aspects"],
            params={
                "model_name": str(tiny_model),
                "epochs": 12,
                "batch_size": 8,
                "max_length": 24,
                "learning_rate": 5e-3,
            },
        )
        run = svc.wait_for(run_id, TERMINAL, 240)
        log = run_paths(svc, run_id).run_log.read_text()
        assert run["state"] == "succeeded", (run, log)
        test = run["held_out"]["aspects"]["test"]
        assert test["f1"] >= 0.8 and test["partial_f1"] >= test["f1"] and set(test["per_label_f1"]) == set(LABELS), test
        assert "train span(s) of aspects overlap an earlier span and were left out (a token takes one tag)" in log
        texts = {
            row["id"]: row["text"] for row in json.loads((svc.config.parent / "data" / "reviews.json").read_text())
        }
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        marked = [(p["instance_id"], s) for p in lines for s in p["payload"]]
        assert marked and all(set(s) == {"start", "end", "label", "confidence"} for _, s in marked)
        # The spans land on the text's own words: a subject after "The ", a judgement word before ".".
        assert all(texts[iid][s["start"] : s["end"]].replace(" ", "").isalpha() for iid, s in marked), marked[:5]
        for route in ("quality", "next"):  # the insight pages read a run of spans without failing
            status, body = svc.api("GET", f"/runs/{run_id}/{route}")
            assert status == 200, (route, body)


def test_two_ranks_with_lora_tag_spans(tmp_path: Path, tiny_model: Path) -> None:
    """Data-parallel (two CPU ranks, gloo: the path two GPUs take) and LoRA, run as a host runs the worker."""
    from tests.e2e.trainers.test_data_parallel import ranks_env, run_to_end
    from tests.e2e.trainers.test_worker import BAD, GOOD, split_ids, synthetic_items, write_bundle, write_spec

    items = []
    for item in synthetic_items():
        word = next(w for w in item["text"].split() if w in GOOD or w in BAD)
        start = item["text"].index(word)
        spans = [{"start": start, "end": start + len(word), "name": "praise" if word in GOOD else "complaint"}]
        items.append({**item, "label": None if item["label"] is None else spans})
    bundle = tmp_path / "bundle"
    write_bundle(
        bundle,
        items,
        scheme={"name": "sentiment", "annotation_type": "span", "kind": "span", "labels": [], "source_field": None},
    )
    params = {
        "model_name": str(tiny_model),
        "epochs": 2,
        "batch_size": 4,
        "learning_rate": 1e-3,
        "max_length": 16,
        "lora": {"r": 4, "alpha": 8, "target_modules": ["query", "value"]},
    }
    run = run_to_end(
        write_spec(tmp_path, bundle, "hf-token-classification", params, schemas=["sentiment"]), ranks_env()
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "work" / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in lines) == sorted(
        split_ids(bundle, "val") | split_ids(bundle, "test") | split_ids(bundle, "unlabeled")
    ), "rank 0 alone wrote them"
    assert all(isinstance(p["payload"], list) for p in lines)
    train = [e for e in run.of("progress") if e["phase"] == "train"]
    assert train[-1]["current"] == train[-1]["total"] == 8, train[-1]  # 13 items a rank, batches of 4, 2 epochs
    assert (tmp_path / "work" / "sentiment" / "config.json").is_file(), "rank 0 saved the merged model"


def test_a_span_scheme_trains_on_the_ssh_backend_too(
    tmp_path: Path, redis_server_url: str, sshd: Sshd, tiny_model: Path
) -> None:
    sshd.write_config("root")
    with spans_stack(
        tmp_path,
        redis_server_url,
        {"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)},
        **gpu_server(tmp_path, python=sys.executable),
    ) as svc:  # a Python with torch
        run_id = svc.start_run(
            trainer="hf-token-classification",
            schemas=["aspects"],
            backend=BACKEND,
            params={
                "model_name": str(tiny_model),
                "epochs": 4,
                "batch_size": 8,
                "max_length": 24,
                "learning_rate": 5e-3,
            },
        )
        run = svc.wait_for(run_id, TERMINAL, 240)
        assert run["state"] == "succeeded" and run["ran_on"] == BACKEND, (run, svc.logs())
        assert {"f1", "partial_f1", "per_label_f1"} <= set(run["held_out"]["aspects"]["test"])
        assert (run_paths(svc, run_id).artifacts / "aspects" / "config.json").is_file(), "the model came back"


def test_potato_draws_the_runs_spans_on_the_item(tmp_path: Path, redis_server_url: str, tiny_model: Path) -> None:
    """Potato 2.12.1 itself draws the predicted spans into the item's text for an annotator who has none."""
    config = make_project(
        tmp_path, grace_seconds=2, writeback={"schemas": ["aspects"], "include_unlabeled": True, "min_confidence": 0.0}
    )
    add_potato_keys(config)
    _add_spans(config)
    potato, svc = PotatoServer(config, tmp_path, ADMIN_KEY), Services(config, redis_server_url, tmp_path)
    try:
        svc.serve()
        svc.executor()
        run_id = svc.start_run(
            trainer="hf-token-classification",
            schemas=["aspects"],
            params={
                "model_name": str(tiny_model),
                "epochs": 12,
                "batch_size": 8,
                "max_length": 24,
                "learning_rate": 5e-3,
            },
        )
        run = svc.wait_for(run_id, TERMINAL, 240)
        assert run["state"] == "succeeded", (run, svc.logs())
        potato.start()
        page = potato.first_page_of("erin")
        served = PotatoAnnotator.ITEM.search(page)
        assert served, page[-3000:]
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        spans = next(p["payload"] for p in lines if p["instance_id"] == served.group(1))
        assert spans, "the served item has predicted spans"
        drawn = re.findall(r'<span[^>]*class="span-highlight[^"]*"[^>]*data-label="([^"]+)"', page)
        assert sorted(drawn) == sorted(s["label"] for s in spans), (drawn, spans, page[-4000:])
    finally:
        svc.stop()
        potato.stop()


def spans_stack(
    tmp_path: Path, redis_url: str, executor_env: dict[str, str] | None = None, **training: Any
) -> AbstractContextManager[Services]:
    """The small project with its scheme added, its server and an executor."""
    return started(tmp_path, redis_url, prepare=_add_spans, executor_env=executor_env, **training)


def _add_spans(config: Path) -> None:
    """The small project gets a span scheme, answered as Potato stores spans for every item its annotators
    labelled: the subject, and the judging word as praise or complaint; every tenth item also has a
    complaint drawn over its subject, which overlaps."""
    data = yaml.safe_load(config.read_text())
    data["annotation_schemes"].append(SCHEME)
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    texts = {
        str(row["id"]): str(row["text"]) for row in json.loads((config.parent / "data" / "reviews.json").read_text())
    }
    for state_path in config.parent.glob("annotation_output/*/user_state.json"):
        state = json.loads(state_path.read_text())
        spans = state.setdefault("instance_id_to_span_to_value", {})
        for instance_id in state["instance_id_to_label_to_value"]:
            found = REVIEW.match(texts[instance_id])
            assert found, texts[instance_id]
            judged = "complaint" if found.group("judged") in NEGATIVE else "praise"
            marks = [
                (found.start("subject"), found.end("subject"), "subject"),
                (found.start("judged"), found.end("judged"), judged),
            ]
            if int(instance_id.lstrip("r")) % 10 == 0:  # the same items for every annotator, who then agree
                marks.append((found.start("subject"), found.end("judged"), "complaint"))
            spans[instance_id] = [
                [
                    {
                        "schema": "aspects",
                        "name": label,
                        "title": label,
                        "start": start,
                        "end": end,
                        "id": f"span_{instance_id}_{start}_{end}",
                        "target_field": None,
                    },
                    True,
                ]
                for start, end, label in marks
            ]
        state_path.write_text(json.dumps(state))

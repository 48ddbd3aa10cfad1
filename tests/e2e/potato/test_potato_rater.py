"""A run as a declared machine rater, against Potato 2.12.1 itself.

A project with `model_training.machine_annotator: {enabled: true}`: a succeeded run's held-out answers become a
user state with an `origin` of kind tool, Potato started on the project lists it as a machine in /admin/iaa
(its headline human-only, `partitions` reported), the annotators' files are byte-identical throughout, a
second run replaces the first one's answers, and removing the rater takes every answer of it back. The rater
is no annotator to potato-queue: the next bundle is built from the same files as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, run_paths, started
from tests.potato_helpers import PotatoAnnotator, PotatoServer, add_potato_keys

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATER = "potato-queue.sklearn-text.sentiment"


def human_files(output: Path) -> dict[str, str]:
    """sha256 of every file in the annotators' folders (not the rater's, not training/, not Potato's own log)."""
    return {
        str(path.relative_to(output)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(output.glob("*/**/*"))
        if path.is_file() and not path.relative_to(output).parts[0].startswith(("potato-queue.", "training"))
    }


def held_out_ids(svc: Services, run_id: str) -> set[str]:
    bundle = run_paths(svc, run_id).bundle_dir
    return {
        json.loads(line)["instance_id"]
        for split in ("val", "test")
        for line in (bundle / f"{split}.jsonl").read_text().splitlines()
    }


def iaa(tmp_path: Path, config: Path) -> dict[str, Any]:
    """Potato's own agreement report, from Potato started on the project (it reads user states at start)."""
    potato = PotatoServer(config, tmp_path, ADMIN_KEY)
    try:
        potato.start()
        status, report = potato.api("GET", "/admin/iaa")
        assert status == 200, report
        return report
    finally:
        potato.stop()


def assert_our_figures_are_potatos(report: dict[str, Any], output: Path) -> None:
    """insight/agreement.py's human-human figures on the items Potato's /admin/iaa counted: Potato's own."""
    from potato_queue.insight.agreement import alpha_nominal, mean_kappa, pairwise_agreement

    answers = {
        name: json.loads((output / name / "user_state.json").read_text())["instance_id_to_label_to_value"]
        for name in ("alice", "bob")
    }
    counted = [
        iid for iid, item in report["partitions"]["human_human"]["items"].items() if "sentiment" in item["schemas"]
    ]
    items = [{name: answers[name][iid][0][1] for name in answers if iid in answers[name]} for iid in counted]
    theirs = report["schemas"]["sentiment"]["metrics"]
    assert len(items) == theirs["n_items"] > 0, (len(items), theirs)
    for ours, name in ((mean_kappa(items), "cohen_kappa"), (pairwise_agreement(items), "percent_agreement")):
        assert ours == pytest.approx(theirs[name], abs=1e-4), (name, ours, theirs)
    assert alpha_nominal(items) == pytest.approx(theirs["alpha_nominal"], abs=1e-4), theirs


def test_a_run_becomes_a_machine_rater_potato_reports_apart_and_removal_takes_it_back(
    tmp_path: Path, redis_server_url: str
) -> None:
    with started(
        tmp_path,
        redis_server_url,
        prepare=lambda config: add_potato_keys(config, num_annotators_per_item=2),
        grace_seconds=2,
        machine_annotator={"enabled": True},
    ) as svc:
        config = svc.config
        output = config.parent / "annotation_output"
        humans = human_files(output)
        first = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        status, refused = svc.api("POST", f"/runs/{first}/rater")
        assert status == 409 and refused["detail"].endswith(
            ": only a succeeded run's answers can be a machine rater; fix: pick a succeeded run (training runs lists them)"
        ), refused
        run = svc.wait_for(first, TERMINAL, 120)
        assert run["state"] == "succeeded", svc.logs()
        state = json.loads((output / RATER / "user_state.json").read_text())
        answered = set(state["instance_id_to_label_to_value"])
        assert run["machine_annotator"] == {"id": RATER, "items": len(answered), "replaced": None}, run
        assert answered and answered <= held_out_ids(svc, first), "only the held-out items, never train"
        assert (state["user_id"], state["origin"]["kind"], state["origin"]["run_id"]) == (RATER, "tool", first)
        assert human_files(output) == humans, "the annotators' files are untouched"

        report = iaa(tmp_path, config)
        assert report["annotators"]["n_machine"] == 1 and report["annotators"]["machine"] == [RATER], report
        assert report["annotators"]["human"] == ["alice", "bob"]
        assert "human_human" in report["partitions"] and "pooled" in report["partitions"], report
        assert report["schemas"] == report["partitions"]["human_human"]["schemas"], "the headline is human-only"
        assert_our_figures_are_potatos(report, output)

        second = svc.start_run(trainer="sklearn-text", schemas=["sentiment"])
        again = svc.wait_for(second, TERMINAL, 120)
        assert again["machine_annotator"]["replaced"] == first, again
        assert again["bundle"]["digest"] == run["bundle"]["digest"], "the rater is no annotator to the bundle"
        assert json.loads((output / RATER / "user_state.json").read_text())["origin"]["run_id"] == second

        status, refused = svc.api("DELETE", f"/runs/{first}/rater")
        assert (status, refused["detail"]) == (
            409,
            f"Run {first} is not a machine rater in Potato: {RATER} holds run {second}'s answers; fix: to take the "
            f"rater out, remove run {second}'s (training rater {second} --remove)",
        ), refused
        assert svc.api("DELETE", f"/runs/{second}/rater") == (200, {"run_id": second, "removed": RATER})
        assert not (output / RATER).exists(), "every answer of it is gone"
        assert human_files(output) == humans
        assert svc.api("GET", f"/runs/{second}")[1]["machine_annotator"] == {"id": RATER, "removed": True}
        status, refused = svc.api("DELETE", f"/runs/{second}/rater")
        assert status == 409 and "holds no run's answers" in refused["detail"], refused

        # From the command line: how each run agrees with the annotators, then the older run made the rater
        # again by hand, and taken out.
        env = {"POTATO_QUEUE_REDIS_URL": redis_server_url}
        figures = run["agreement"]["sentiment"]
        assert figures["items"] > 0 and figures["annotators"] == 2, figures
        assert figures["model_human"]["kappa"] is not None and figures["human_human"]["kappa"] is not None
        listed = run_cli("training", "runs", config, "--agreement", env=env)
        assert f"{first} sentiment: {figures['said']}" in listed.stdout.splitlines(), listed.stdout
        made = run_cli("training", "rater", first, config, env=env)
        assert made.returncode == 0, made.stderr
        assert made.stdout.startswith(
            f"{first}: a machine rater in Potato as {RATER}, {len(answered)} items on the "
        ), made.stdout
        assert json.loads((output / RATER / "user_state.json").read_text())["origin"]["run_id"] == first
        removed = run_cli("training", "rater", first, config, "--remove", env=env)
        assert (removed.returncode, removed.stdout) == (
            0,
            f"{first}: removed from Potato as the machine rater {RATER}\n",
        )
        assert human_files(output) == humans and not (output / RATER).exists()


def adjudication_queue(potato: PotatoServer, adjudicator: str) -> list[dict[str, Any]]:
    signed_in = PotatoAnnotator(potato.url, adjudicator)
    with signed_in.opener.open(potato.url + "/adjudicate/api/queue", timeout=30) as resp:
        return list(json.loads(resp.read())["items"])


def test_with_include_machine_annotators_a_model_human_disagreement_reaches_potatos_adjudication(
    tmp_path: Path, redis_server_url: str
) -> None:
    """majority-baseline answers every item with the commonest label: where the annotators chose another, only
    the model disagrees. Potato's adjudication queues such an item once it counts machine raters."""
    adjudication = {
        "enabled": True,
        "include_machine_annotators": True,
        "adjudicator_users": ["adjudicator"],
        "show_annotator_names": True,
    }
    rater = "potato-queue.majority-baseline.sentiment"
    with started(
        tmp_path,
        redis_server_url,
        prepare=lambda config: add_potato_keys(config, adjudication=adjudication),
        grace_seconds=2,
        machine_annotator={"enabled": True},
    ) as svc:
        run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"])
        assert svc.wait_for(run_id, TERMINAL, 120)["state"] == "succeeded", svc.logs()
        output = svc.config.parent / "annotation_output"
        model = json.loads((output / rater / "user_state.json").read_text())["instance_id_to_label_to_value"]
        humans = {
            name: json.loads((output / name / "user_state.json").read_text())["instance_id_to_label_to_value"]
            for name in ("alice", "bob")
        }
        only_the_model = {
            iid
            for iid, answer in model.items()
            if (said := {h[iid][0][1] for h in humans.values() if iid in h})
            and answer[0][1] not in said
            and len(said) == 1
        }
        assert only_the_model, "the baseline disagrees with the annotators somewhere"
        potato = PotatoServer(svc.config, tmp_path, ADMIN_KEY)
        try:
            potato.start()
            queued = {item["instance_id"]: item for item in adjudication_queue(potato, "adjudicator")}
            add_potato_keys(svc.config, adjudication={**adjudication, "include_machine_annotators": False})
            potato.restart()
            without = {item["instance_id"] for item in adjudication_queue(potato, "adjudicator")}
        finally:
            potato.stop()
    assert only_the_model <= set(queued), (only_the_model - set(queued), sorted(queued)[:10])
    assert not only_the_model & without, "without machine raters, no annotator disagreed on those items"
    some = queued[sorted(only_the_model)[0]]
    assert rater in some["annotations"] and "(tool)" in some["annotator_origins"][rater], some

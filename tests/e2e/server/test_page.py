"""The Training page in a real browser: Debian's headless chromium driven by Playwright, against a real
server, executor and agent (Redis, `potato-queue serve`, `potato-queue executor`, the local backend).

The ssh, slurm and agent backends in the config are there for the Runs on menu (their hosts are not
reached). Screenshots of the page with a run in flight and of a run's page are saved under the
session's test output folder (<pytest basetemp>/screenshots/), for a person to look at.

The page's Content-Security-Policy forbids eval, so wait_for_function is given functions (`() => ...`):
Playwright evaluates a function once, but an expression again at each poll, which the policy then refuses.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.lifecycle_helpers import (
    ADMIN_KEY,
    TERMINAL,
    Services,
    make_project,
    run_paths,
    started,
    wait_until,
)
from tests.sshd import free_port

CHROMIUM = "/usr/bin/chromium"
BACKENDS = {
    "gpu-server": {"type": "ssh", "host": "gpu.example.org"},
    "cluster": {"type": "slurm", "host": "login.cluster.example.org", "remote_dir": "/shared/me/potato"},
    "lab-workstation": {"type": "agent"},
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail("the Training page's tests need Debian's chromium: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.getbasetemp() / "screenshots"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def svc(tmp_path: Path, redis_server_url: str) -> Iterator[Services]:
    port = free_port()
    # The default backend is not the menu's first entry, so that preselecting it is seen.
    with started(
        tmp_path, redis_server_url, executors=0, backend="gpu-server", backends=BACKENDS, grace_seconds=3
    ) as svc:
        svc.stop()  # on a port of its own, so that a restart comes back at the same address
        svc.procs.clear()
        svc.serve("127.0.0.1", "--port", str(port))
        svc.executor()
        yield svc


def signed_in(browser: Any, svc: Services) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{svc.url}/admin/training")
    page.fill("#key", ADMIN_KEY)
    page.click("button[type=submit]")
    page.wait_for_selector("#backend option", state="attached", timeout=60000)
    return page


def runs_rows(page: Any) -> list[dict[str, str]]:
    return page.eval_on_selector_all(
        "#runs tbody tr",
        """rows => rows.map(r => ({run: r.dataset.run,
        state: r.dataset.state, trainer: r.children[1].textContent, ran_on: r.children[2].textContent,
        trigger: r.children[4].textContent, step: r.children[8].textContent}))""",
    )


def start_from_form(page: Any, trainer: str, **params: Any) -> None:
    page.select_option("#backend", "local")
    page.select_option("#trainer", trainer)
    for name, value in params.items():
        page.fill(f"#param-{name}", str(value))
    page.click("#start-run")


def test_sign_in_refuses_a_wrong_key_and_the_cookie_is_httponly_and_strict(browser: Any, svc: Services) -> None:
    page = browser.new_page()
    page.goto(f"{svc.url}/admin/training")
    page.fill("#key", "not-the-key")
    page.click("button[type=submit]")
    assert page.text_content("[role=alert]") == "That is not the admin key."
    assert page.context.cookies() == []
    page.fill("#key", ADMIN_KEY)
    page.click("button[type=submit]")
    page.wait_for_selector("#runs")
    (cookie,) = page.context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == ("pq_session", True, "Strict")
    assert ADMIN_KEY not in cookie["value"]
    assert page.evaluate("document.cookie") == "", "no script can read the session"
    page.click("text=Sign out")
    page.wait_for_selector("#key")
    assert page.context.cookies() == []


def test_the_menu_lists_every_backend_with_type_and_host_and_preselects_the_default(
    browser: Any, svc: Services
) -> None:
    page = signed_in(browser, svc)
    labels = page.eval_on_selector_all("#backend option", "options => options.map(o => o.textContent)")
    assert labels[1:] == [
        "gpu-server (ssh to gpu.example.org)",
        "cluster (slurm on login.cluster.example.org)",
        "lab-workstation (agent)",
    ]
    assert labels[0].startswith("local (this machine, ") and "being checked" not in labels[0], labels
    assert page.eval_on_selector("#backend", "s => s.value") == "gpu-server"
    page.select_option("#backend", "local")
    page.click("#check")
    page.wait_for_function(
        "() => document.getElementById('check-report').textContent.includes('local: this machine')", timeout=60000
    )
    assert page.text_content("#check-report").startswith("ok\n")
    # The agent backend has no token yet: the page says so, with the command to issue one.
    page.wait_for_function(
        "() => document.querySelector('#agents pre').textContent.includes('no token issued yet')", timeout=60000
    )
    assert "potato-queue training register lab-workstation" in page.text_content("#agents pre")
    # Drain: the backend's agents finish their run and claim no new one, until switched off again.
    page.click("#agents button.drain")
    page.wait_for_function(
        "() => document.querySelector('#agents pre').textContent.includes('draining: switched on')", timeout=30000
    )
    assert page.text_content("#agents button.drain") == "Stop draining"
    assert svc.api("GET", "/backends/lab-workstation/check")[1]["drain_switched"] is not None
    page.click("#agents button.drain")
    page.wait_for_function(
        "() => document.querySelector('#agents button.drain').textContent === 'Drain its agents'", timeout=30000
    )
    assert svc.api("GET", "/backends/lab-workstation/check")[1]["drain_switched"] is None


def test_a_run_started_from_the_form_moves_live_and_succeeds_without_a_reload(
    browser: Any, svc: Services, tiny_model: Path, screenshots: Path
) -> None:
    page = signed_in(browser, svc)
    page.evaluate("window.notReloaded = true")
    start_from_form(page, "hf-text-classification", model_name=tiny_model, epochs=4, batch_size=4)
    steps: set[str] = set()
    deadline = time.monotonic() + 120
    shot = False
    while time.monotonic() < deadline:
        rows = runs_rows(page)
        if rows:
            steps.add(rows[0]["step"])
            if not shot and "training" in rows[0]["step"]:
                page.screenshot(path=str(screenshots / "training-page-run-in-flight.png"), full_page=True)
                shot = True
            if rows[0]["state"] in TERMINAL:
                break
        time.sleep(0.1)
    (row,) = runs_rows(page)
    assert row["state"] == "succeeded", row
    assert (row["trainer"], row["ran_on"], row["trigger"]) == ("hf-text-classification", "local", "page")
    assert len(steps - {""}) >= 3, steps
    assert shot and page.evaluate("window.notReloaded") is True
    # The run's page: one point on the chart per metric event.
    page.click(f"a[href='/admin/training/runs/{row['run']}']")
    page.wait_for_selector("#predictions table", timeout=60000)
    events = svc.api("GET", f"/runs/{row['run']}/events")[1]
    metric_events = [e for e in events if e["event"] == "metric" and isinstance(e.get("value"), int | float)]
    assert len(metric_events) > 2
    page.wait_for_function(f"() => document.querySelectorAll('#chart circle.point').length === {len(metric_events)}")
    assert "train/loss" in page.text_content("#chart .legend")
    assert "held-out scores" in page.text_content("#log")
    prelabels = svc.api("GET", f"/runs/{row['run']}")[1]["prelabels"]
    assert prelabels["said"].startswith(f"published {prelabels['published']} of this run's ")
    assert prelabels["said"] in page.text_content("#facts"), "the page counts what Potato's rules publish"
    assert page.get_attribute("#predictions a[download]", "href").endswith("/predictions.jsonl")
    page.screenshot(path=str(screenshots / "run-page.png"), full_page=True)


def test_cancel_run_asks_first_and_cancels(browser: Any, svc: Services, tiny_model: Path) -> None:
    page = signed_in(browser, svc)
    start_from_form(page, "hf-text-classification", model_name=tiny_model, epochs=500, batch_size=4)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#runs tbody td.step')].some(t => t.textContent.includes('training'))",
        timeout=120000,
    )
    answers: list[str] = []

    def answer(dialog: Any) -> None:
        answers.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    page.click("#runs tbody button")
    page.wait_for_selector("#runs tbody tr[data-state=cancelled]", timeout=60000)
    assert answers and answers[0].startswith("Cancel run ")


def test_retry_from_its_checkpoint_asks_first_and_the_two_runs_link_to_each_other(browser: Any, svc: Services) -> None:
    from potato_queue.wire.checkpoint import Checkpoints

    params = {"hold_s": 8, "checkpoint_every_steps": 1}
    old = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local", params=params)
    folder = run_paths(svc, old).local_checkpoints / old
    wait_until(lambda: Checkpoints(str(folder)).latest() is not None, 60, "a whole checkpoint of the run")
    assert svc.api("POST", f"/runs/{old}/cancel")[0] == 200
    assert svc.wait_for(old, TERMINAL, 60)["state"] == "cancelled"
    page = signed_in(browser, svc)
    page.goto(f"{svc.url}/admin/training/runs/{old}")
    page.wait_for_selector("#retry:not([hidden])", timeout=30000)
    answers: list[str] = []

    def answer(dialog: Any) -> None:
        answers.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    page.click("#retry")
    page.wait_for_selector("#facts a", timeout=30000)  # the retry's page, linking to the run it resumes
    assert answers == [f"Retry run {old} as a new run that resumes from its last checkpoint, on the same data?"]
    retry = page.get_attribute("#run", "data-run")
    assert retry != old and page.get_attribute("#facts a", "href") == f"/admin/training/runs/{old}"
    assert "Resumes run" in page.text_content("#facts")
    assert svc.wait_for(retry, TERMINAL, 90)["state"] == "succeeded", svc.logs()
    page.wait_for_function("() => document.getElementById('state').textContent === 'succeeded'", timeout=30000)
    assert page.is_hidden("#retry"), "a succeeded run has nothing to retry"
    page.goto(f"{svc.url}/admin/training/runs/{old}")
    page.wait_for_selector("#facts a", timeout=30000)
    assert page.get_attribute("#facts a", "href") == f"/admin/training/runs/{retry}"
    assert "Retried as run" in page.text_content("#facts") and page.is_hidden("#retry")


def test_a_line_of_predictions_that_is_not_json_is_skipped_and_said(browser: Any, svc: Services) -> None:
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    assert svc.wait_for(run_id, TERMINAL, 90)["state"] == "succeeded", svc.logs()
    predictions = run_paths(svc, run_id).predictions
    whole = predictions.read_text().splitlines()
    # The agent's file, cut short in its middle (a full disk on the training machine, a hostile agent).
    predictions.write_text("\n".join([*whole[:2], '{"instance_id": "cut', *whole[2:]]) + "\n")
    page = signed_in(browser, svc)
    page.goto(f"{svc.url}/admin/training/runs/{run_id}")
    page.wait_for_selector("#predictions table", timeout=30000)
    said = page.text_content("#predictions")
    assert f"{len(whole)} predictions" in said, said
    assert "1 line of predictions.jsonl is not a JSON prediction and not shown (download the file to see it)" in said
    assert "reconnecting" not in page.text_content("#step")


def test_the_model_beside_the_annotators_and_made_a_machine_rater_from_the_page(browser: Any, svc: Services) -> None:
    run_id = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend="local")
    run = svc.wait_for(run_id, TERMINAL, 90)
    assert run["state"] == "succeeded", svc.logs()
    page = signed_in(browser, svc)
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{svc.url}/admin/training/runs/{run_id}")
    page.wait_for_selector("#agreement:not([hidden]) table", timeout=30000)
    said = page.text_content("#agreement")
    assert run["agreement"]["sentiment"]["said"] in said, said
    assert "The annotators with each other" in said and "The model with the annotators" in said
    assert "never the run's train split" in said and "Not a machine rater in Potato." in said
    rater = svc.config.parent / "annotation_output" / "potato-queue.sklearn-text.sentiment" / "user_state.json"
    page.click("#rater")
    page.wait_for_function("() => document.getElementById('rater-said').textContent.startsWith('A machine rater')")
    assert "as potato-queue.sklearn-text.sentiment" in page.text_content("#rater-said") and rater.is_file()
    page.click("#rater")
    page.wait_for_function(
        "() => document.getElementById('rater-said').textContent === 'Not a machine rater in Potato.'"
    )
    assert not rater.exists()


def test_run_it_again_from_the_page_opens_the_rerun_compared_with_its_original(browser: Any, svc: Services) -> None:
    first = svc.start_run(trainer="sklearn-text", schemas=["sentiment"], backend="local")
    assert svc.wait_for(first, TERMINAL, 90)["state"] == "succeeded", svc.logs()
    page = signed_in(browser, svc)
    asked: list[str] = []
    page.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.goto(f"{svc.url}/admin/training/runs/{first}")
    # This machine has no GPU: the run's GPU use says so rather than show a figure.
    page.wait_for_function("() => document.getElementById('facts').textContent.includes('GPU use')")
    assert "no GPU measured: no nvidia-smi on" in page.text_content("#facts")
    page.click("#rerun:not([hidden])")
    page.wait_for_function(f"() => document.getElementById('run').dataset.run !== '{first}'")
    again = page.get_attribute("#run", "data-run")
    assert asked == [f"Run {first} again on the same data, params and seed, and compare the two?"]
    assert svc.wait_for(again, TERMINAL, 90)["state"] == "succeeded", svc.logs()
    page.wait_for_selector("#made-same", timeout=60000)  # compared with its original without being asked
    assert page.input_value("#compare-with") == first
    assert "Where they disagree (0)" in page.text_content("#compared")


def post(svc: Services, path: str, cookie: str, **headers: str) -> int:
    request = urllib.request.Request(
        f"{svc.url}/admin/training/api{path}",
        method="POST",
        data=json.dumps({"trainer": "majority-baseline", "schemas": ["sentiment"]}).encode(),
        headers={"Content-Type": "application/json", "Cookie": cookie, **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def test_a_cross_site_post_is_refused(browser: Any, svc: Services) -> None:
    page = signed_in(browser, svc)
    (cookie,) = page.context.cookies()
    session = f"pq_session={cookie['value']}"
    csrf = page.get_attribute('meta[name="csrf"]', "content")
    assert post(svc, "/runs", session, Origin="http://evil.example") == 403
    assert post(svc, "/runs", session) == 403, "the cookie alone (no token) starts nothing"
    assert post(svc, "/runs", session, Origin="http://evil.example", **{"X-CSRF-Token": csrf}) == 403
    # Without the cookie, a page on another site cannot even send it (SameSite=Strict); with the page's own
    # token from the same origin the request goes through.
    assert post(svc, "/runs", session, Origin=svc.url, **{"X-CSRF-Token": csrf}) == 202


def test_the_page_recovers_after_the_server_restarts(browser: Any, svc: Services) -> None:
    page = signed_in(browser, svc)
    page.wait_for_function("() => document.getElementById('live').textContent === 'live'")
    server = svc.procs[0]
    # os.killpg, never the kill binary: Debian 12's procps-ng 4.0.2 `kill -TERM -<pgid>` signals every process
    # (kill(-1), seen under strace).
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(30)
    page.wait_for_function("() => document.getElementById('live').textContent === 'reconnecting'", timeout=30000)
    port = svc.url.rsplit(":", 1)[1]
    svc.serve("127.0.0.1", "--port", port)
    run_id = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    page.wait_for_selector(f"#runs tbody tr[data-run='{run_id}'][data-state=succeeded]", timeout=90000)
    assert page.text_content("#live") == "live"


def test_the_page_is_readable_at_a_phones_width(browser: Any, svc: Services) -> None:
    page = signed_in(browser, svc)
    page.set_viewport_size({"width": 390, "height": 844})
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width} px wide at a phone's 390"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") in ("BUTTON", "SELECT", "A", "INPUT")


def test_the_form_offers_a_trainer_only_the_schemes_of_the_kinds_it_trains(
    tmp_path: Path, redis_server_url: str, browser: Any
) -> None:
    """A radio, a multiselect, a likert, a slider, a span and a textbox scheme (tests/fixtures/two_annotators)."""
    svc = Services(
        make_project(tmp_path, source=ROOT / "tests" / "fixtures" / "two_annotators"), redis_server_url, tmp_path
    )
    svc.serve()
    try:
        page = signed_in(browser, svc)
        page.select_option("#trainer", "sklearn-text")
        offered = page.eval_on_selector_all(
            "#schemas label",
            """labels => labels.map(l => [l.querySelector("input").value,
            l.querySelector("input").disabled, l.querySelector("input").checked, l.querySelector(".schema-why").textContent])""",
        )
        assert offered[:4] == [
            ["sentiment", False, True, ""],
            ["topics", False, True, ""],
            ["quality", False, True, ""],
            ["intensity", False, True, ""],
        ]
        assert [
            "highlight",
            True,
            False,
            " (span, span: sklearn-text trains nominal/multilabel/ordinal/continuous schemes)",
        ] in offered
        assert [
            "notes",
            True,
            False,
            " (textbox, text: no trainer trains it: its answer is free text)",
        ] in offered
        page.select_option("#trainer", "majority-baseline")  # a trainer that does not take the multiselect
        page.wait_for_function("() => document.querySelector('#schema-topics').disabled")
        assert not page.is_checked("#schema-topics") and page.is_checked("#schema-sentiment")
        assert page.is_disabled("#schema-quality") and not page.is_checked("#schema-quality")
        page.close()
    finally:
        svc.stop()


def test_the_page_says_why_auto_retrain_waits(tmp_path: Path, redis_server_url: str, browser: Any) -> None:
    retrain = {"enabled": True, "trainer": "majority-baseline", "schemas": ["sentiment"], "update_frequency": 500}
    budget = {"gpu_hours_per_month": 40}
    with started(tmp_path, redis_server_url, executors=1, auto_retrain=retrain, budget=budget) as svc:
        page = signed_in(browser, svc)
        line = page.locator("#auto-retrain")
        line.wait_for(state="visible", timeout=30000)
        assert line.inner_text() == "Auto-retrain: no beat has checked yet: start `potato-queue beat CONFIG` (or `up`)"
        # The month's budget beside it: nothing used yet.
        month = datetime.now(timezone.utc).strftime("%B %Y")
        page.locator("#budget").wait_for(state="visible", timeout=30000)
        assert page.inner_text("#budget") == f"Budget: the project: 0 of 40 GPU-hours used in {month}, 40 left"
        beat = svc._spawn("beat", str(svc.config), "--every-s", "0.5", name="beat")
        wanted = "waiting for 340 more annotations (160 of 500 since the last auto run)"
        # The page asks again every 15 s; once the beat's first check is in, a reload shows it at once.
        wait_until(
            lambda: svc.api("GET", "/auto_retrain")[1].get("reason") == wanted or beat.poll() is not None,
            60,
            "the beat's first check",
        )
        assert beat.poll() is None, svc.logs()
        page.reload()
        line = page.locator("#auto-retrain")
        line.wait_for(state="visible", timeout=30000)
        page.wait_for_function(
            "t => document.querySelector('#auto-retrain').innerText === t", arg=f"Auto-retrain: {wanted}", timeout=30000
        )
        page.close()


def test_a_runs_page_shows_the_curve_reliability_what_to_label_next_and_a_comparison(
    browser: Any, svc: Services, screenshots: Path
) -> None:
    page = signed_in(browser, svc)
    page.select_option("#backend", "local")
    page.select_option("#trainer", "sklearn-text")
    page.check("#learning-curve")
    page.click("#start-run")
    wait_until(lambda: runs_rows(page) and runs_rows(page)[0]["state"] in TERMINAL, 120, "the curve run to end")
    curve_run = runs_rows(page)[0]["run"]
    assert runs_rows(page)[0]["state"] == "succeeded" and svc.api("GET", f"/runs/{curve_run}")[1]["params"] == {
        "learning_curve": True
    }, "the box asks for the curve"
    baseline = svc.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    assert svc.wait_for(baseline, TERMINAL)["state"] == "succeeded"
    page.goto(f"{svc.url}/admin/training/runs/{curve_run}")
    # Will more labels help: a point per fit and split, and the gain in words
    page.wait_for_selector("#curve:not([hidden])", timeout=60000)
    curve = svc.api("GET", f"/runs/{curve_run}/curve")[1]["schemas"]["sentiment"]
    splits = [s for s in ("test", "val") if all(f"{s}_macro_f1" in p for p in curve["points"])]
    assert page.locator("#curve-chart circle.point").count() == 4 * len(splits) >= 4
    assert curve["said"][1:] in page.text_content("#curve-said")
    # Good enough to prelabel with: a point per filled bin; the threshold follows the typed precision
    page.wait_for_selector("#quality:not([hidden])")
    quality = svc.api("GET", f"/runs/{curve_run}/quality?target_precision=0.5")[1]["schemas"]["sentiment"]
    assert page.locator("#reliability circle.point").count() == sum(1 for b in quality["reliability"]["bins"] if b["n"])
    page.fill("#target-precision", "0.5")
    page.dispatch_event("#target-precision", "change")
    threshold = quality["threshold"]
    page.wait_for_function("() => document.getElementById('threshold').textContent.includes('target 0.5')")
    said = page.text_content("#threshold")
    assert f"min_confidence {threshold['min_confidence']} keeps precision at " in said
    assert f"it would prelabel {threshold['kept']} of the {threshold['of']} held-out items" in said
    # What to label next, and the order handed to Potato (this project lacks Potato's priority keys: said)
    found = svc.api("GET", f"/runs/{curve_run}/next?limit=20")[1]
    assert page.locator("#next-items tbody tr").count() == len(found["items"]) > 0
    assert page.text_content("#next-items tbody tr td:nth-child(2)") == found["items"][0]["instance_id"]
    page.click("#to-potato")
    page.wait_for_function("() => document.getElementById('to-potato-said').textContent.includes('restart Potato')")
    assert "assignment_strategy: priority" in page.text_content("#to-potato-said")
    # Compared with the baseline: the API's verdict and every disagreement listed
    page.select_option("#compare-with", baseline)
    page.wait_for_selector("#compared table.disagreements")
    compared = svc.api("GET", f"/runs/{curve_run}/compare/{baseline}")[1]["schemas"]["sentiment"]
    assert compared["said"] in page.text_content("#compared")
    assert page.locator("#compared table.disagreements tbody tr").count() == len(compared["disagreements"])
    assert page.locator("#compared table.confusion").count() == 2
    page.screenshot(path=str(screenshots / "run-page-insight.png"), full_page=True)


def test_the_runs_table_says_how_many_runs_there_are_loads_older_ones_and_filters(
    tmp_path: Path, redis_server_url: str, browser: Any
) -> None:
    """Issue 52: 60 runs, the live table the newest 50; "Older runs" loads the rest, and the filters narrow what is
    loaded by state, trainer and where it ran."""
    import redis

    from potato_queue.run import RunState
    from potato_queue.store import RunStore
    from potato_queue.validate import load_checked

    with started(tmp_path, redis_server_url, executors=0) as svc:
        store = RunStore(load_checked(svc.config), redis.Redis.from_url(redis_server_url))
        for k in range(60):
            trainer = "sklearn-text" if k % 3 == 0 else "majority-baseline"
            run_id = store.create(trainer=trainer, schemas=["sentiment"], backend="local")["run_id"]
            steps = (RunState.STARTING, RunState.RUNNING, RunState.COLLECTING, RunState.SUCCEEDED)
            for step in steps if k % 2 else (RunState.STARTING, RunState.FAILED):
                assert store.transition(run_id, step) is not None, (k, step)
        page = signed_in(browser, svc)
        page.wait_for_function(
            "() => document.querySelector('#history').innerText.includes('of 60 runs')", timeout=30000
        )
        assert page.inner_text("#history") == "Showing the newest 50 of 60 runs"
        page.click("#older")
        page.wait_for_function("() => document.querySelectorAll('#runs tr[data-run]').length === 60", timeout=30000)
        assert page.inner_text("#history") == "Showing the newest 60 of 60 runs" and page.is_hidden("#older")
        older = page.eval_on_selector_all("#older-runs tr", "rows => rows.map(r => r.dataset.run)")
        assert older == list(reversed(store.run_ids()[:10])), "the ten oldest, newest first, after the live fifty"
        page.select_option("#filter-state", "failed")
        page.select_option("#filter-trainer", "sklearn-text")
        visible = page.eval_on_selector_all("#runs tr[data-run]:not([hidden])", "rows => rows.map(r => r.dataset.run)")
        wanted = [
            r
            for r in store.run_ids()
            if store.read(r)["state"] == "failed" and store.read(r)["trainer"] == "sklearn-text"
        ]
        assert sorted(visible) == sorted(wanted) and len(wanted) == 10
        page.close()

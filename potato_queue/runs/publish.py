"""Publish a run's model to the Hugging Face Hub: the checks, the upload, its state.

A run that succeeded and whose model files are on this server (its artifacts folder) is published with
huggingface_hub's upload API: `create_repo` (private unless asked otherwise; a repo that exists is kept as
it is) then `upload_folder` of the model files and a README.md written from the run (runs/model_card.py).
The upload runs in a thread of the server process that was asked (an upload can take minutes), under a
lease in Redis (store.publish_lease) that it renews while it runs, so a run is uploaded once at a time and
a server that dies mid-upload is seen as such within seconds. The run's record keeps the outcome
(`hub`: state, repo_id, private, url, revision, error); run.log says it in a line.

The token comes from the request or the server's environment (huggingface_hub's own lookup: HF_TOKEN, or
a saved `hf auth login`), and is held only by the upload's thread: never in Redis, run.json, run.log or
an error's text. The Hub's address is huggingface_hub's too: HF_ENDPOINT, else https://huggingface.co.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato_queue.errors import Conflict, Invalid
from potato_queue.run import RunRecord, RunState
from potato_queue.runs.model_card import HUB_NAME, model_card, trainer_card
from potato_queue.store import RunStore
from potato_queue.store.lease import Lease
from potato_queue.store.records import utc_now
from potato_queue.wire.text import one_line

__all__ = [
    "Publish",
    "PUBLISHING",
    "PUBLISHED",
    "FAILED",
    "MAX_REPO_ID",
    "SERVER_STOPPED",
    "check_repo_id",
    "model_files",
    "publish_status",
    "start_publish",
]

# Not a run state: the last publish of a run (its `hub.state`); "publish_failed", since "failed" is a run's.
PUBLISHING, PUBLISHED, FAILED = "publishing", "published", "publish_failed"
MAX_REPO_ID = 96  # the Hub's own limit
MAX_ERROR_CHARS = 1000
_REPO_ID = re.compile(rf"^{HUB_NAME}/{HUB_NAME}$")
SERVER_STOPPED = "the server stopped before the upload ended; publish again"
HIDDEN_TOKEN = "<token>"


@dataclass(frozen=True)
class Publish:
    """What a publish was asked for. The token is never printed with it, nor kept past the upload."""

    repo_id: str
    private: bool = True
    token: str | None = field(default=None, repr=False)


def check_repo_id(repo_id: str) -> None:
    """Invalid unless `repo_id` is a Hub model repo id: namespace/name (huggingface_hub's rules)."""
    if (
        len(repo_id) <= MAX_REPO_ID
        and _REPO_ID.fullmatch(repo_id)
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(".git")
    ):
        return
    raise Invalid(
        f"{repo_id!r} is not a Hugging Face Hub repo id",
        fix=f"write it as namespace/name (your user or organization, then the model's name), in letters, "
        f"digits, - _ and . (not -- nor .., not first or last), at most {MAX_REPO_ID} characters: "
        f"e.g. my-lab/reviews-sentiment",
    )


def _bring_back(store: RunStore, record: RunRecord, host: str, where: str, artifacts: Path) -> str:
    """How the files of a run that left them on its training machine get here, for its backend's type."""
    backend = str(record.get("backend") or "")
    try:
        kind: str = store.config.model_training.backend_config(backend).type
    except KeyError:
        kind = "unknown"  # no longer in the config
    if kind == "agent":
        return f"copy them from the agent's machine ({host}) into {artifacts}/, then publish again"
    fix = f"copy them here (scp -r {host}:{where}/. {artifacts}/), then publish again"
    if kind in ("ssh", "slurm"):
        fix += f"; backend {backend} copies later runs' files back with fetch_artifacts: true (the default)"
    return fix


def model_files(store: RunStore, record: RunRecord) -> Path:
    """The run's model files on this server (its artifacts folder); Conflict, saying why and the fix, for a
    run that did not succeed or whose files are not here."""
    run_id, state = record["run_id"], record["state"]
    if state != RunState.SUCCEEDED:
        raise Conflict(
            f"Run {run_id} is {state}: only a run that succeeded has a model to publish",
            fix="publish a run that succeeded (potato-queue training runs CONFIG lists them)",
        )
    artifacts = store.paths(run_id).artifacts
    if artifacts.is_dir() and any(p.is_file() for p in artifacts.rglob("*")):
        return artifacts
    uri = record.get("artifact_uri")
    if not uri:
        raise Conflict(f"Run {run_id} kept no model files", fix="its run.log says why; train again to publish")
    if uri == str(artifacts):
        raise Conflict(
            f"The model files of run {run_id} are gone from {artifacts} (model_training.retain_runs "
            f"removes older runs' files)",
            fix="train again, or raise retain_runs to keep more runs' files",
        )
    host, _, where = uri.partition(":")
    raise Conflict(
        f"The model files of run {run_id} stayed on {host} at {where}: only model files on this "
        f"server can be published",
        fix=_bring_back(store, record, host, where, artifacts),
    )


def publish_status(store: RunStore, record: RunRecord) -> dict[str, Any]:
    """What the run page shows: the last publish (`hub`; None before any) and, where the run cannot be
    published, why (`refused`: message and fix)."""
    hub = dict(record.get("hub") or {})
    if hub.get("state") == PUBLISHING and not store.publishing(record["run_id"]):
        hub.update(state=FAILED, error=SERVER_STOPPED)  # its lease lapsed: no process uploads it any more
    try:
        model_files(store, record)
        refused = None
    except Conflict as exc:
        refused = {"message": exc.message, "fix": exc.fix}
    return {"run_id": record["run_id"], "state": record["state"], "hub": hub or None, "refused": refused}


def _token(given: str | None) -> str:
    try:
        from huggingface_hub import get_token
    except ImportError:
        raise Conflict(
            "This server cannot publish to the Hugging Face Hub: huggingface_hub is not installed",
            fix=f"install it into the server's Python ({sys.executable} -m pip install "
            f"'potato-queue[publish]'), then restart the server",
        ) from None
    token = given or get_token()
    if not token:
        raise Invalid(
            "No Hugging Face token to publish with",
            fix="give a write token with the request (it is not stored), or set HF_TOKEN in the server's environment",
        )
    return token


def start_publish(store: RunStore, record: RunRecord, request: Publish) -> dict[str, Any]:
    """Check the request, then upload in a thread of this process: the status at the start (`publishing`).
    Invalid for a repo id or no token, Conflict for a run not publishable or one being published."""
    check_repo_id(request.repo_id)
    run_id = record["run_id"]
    artifacts = model_files(store, record)
    token = _token(request.token)
    lease = store.publish_lease(run_id)
    if not lease.try_take():
        raise Conflict(
            f"Run {run_id} is being published already",
            fix="wait for that upload to end (the run's page shows it), then publish again",
        )
    hub = {
        "state": PUBLISHING,
        "repo_id": request.repo_id,
        "private": request.private,
        "started_at": utc_now(store.clock),
    }
    try:
        record = store.update(run_id, hub=hub)
    except BaseException:
        lease.release()
        raise
    visibility = "private" if request.private else "public"
    store.log(run_id, f"publishing the model to the Hugging Face Hub as {request.repo_id} ({visibility})")
    threading.Thread(
        target=_upload, args=(store, record, request, token, artifacts, lease), daemon=True, name=f"publish-{run_id}"
    ).start()
    return publish_status(store, record)


def _upload(store: RunStore, record: RunRecord, request: Publish, token: str, artifacts: Path, lease: Lease) -> None:
    """The thread: upload, then the outcome into the record and run.log, then the lease let go."""
    run_id = record["run_id"]
    hub: dict[str, Any] = {"repo_id": request.repo_id, "private": request.private, "finished_at": utc_now(store.clock)}
    try:
        with lease.kept():
            url, revision = _push(store, record, request, token, artifacts)
        hub.update(state=PUBLISHED, url=url, revision=revision, finished_at=utc_now(store.clock))
        line = f"published to {url} (revision {revision})"
    except Exception as exc:  # noqa: BLE001 - whatever the upload met ends the publish, said; never the server
        error = _scrubbed(f"{type(exc).__name__}: {exc}", token)
        hub.update(state=FAILED, error=error, finished_at=utc_now(store.clock))
        line = f"publishing to the Hugging Face Hub failed: {error}"
    try:
        store.log(run_id, line)  # before run.json: whoever sees the publish's end there finds its line
        store.update(run_id, hub=hub)
    finally:
        lease.release()


def _scrubbed(text: str, token: str) -> str:
    """An error's text as it may be kept: one line, cut short, the token (should it be quoted) hidden."""
    return one_line(text.replace(token, HIDDEN_TOKEN))[:MAX_ERROR_CHARS]


def _push(store: RunStore, record: RunRecord, request: Publish, token: str, artifacts: Path) -> tuple[str, str]:
    """create_repo, then upload_folder of the model files with the README.md: (the repo's URL, the commit)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # a bar per file would fill the server's log
    api = HfApi(token=token)  # the endpoint: HF_ENDPOINT, else the Hub's
    repo_url = api.create_repo(request.repo_id, private=request.private, exist_ok=True)
    readme = model_card(record, trainer_card(artifacts), store.config, request.repo_id)
    folder = _staged(store.paths(record["run_id"]).hub_upload, artifacts, readme)
    try:
        commit = api.upload_folder(
            repo_id=request.repo_id, folder_path=folder, commit_message=f"potato-queue run {record['run_id']}"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return str(repo_url), str(commit.oid)


def _staged(folder: Path, artifacts: Path, readme: str) -> Path:
    """The folder upload_folder reads: the model files hard-linked (copied where links fail) and the
    README.md beside them, so the run's own files are never written to."""
    shutil.rmtree(folder, ignore_errors=True)
    for source in sorted(artifacts.rglob("*")):
        target = folder / source.relative_to(artifacts)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(readme, encoding="utf-8")
    return folder

"""The job an agent receives: trainer, params, limits, and the bundle it downloads."""

from __future__ import annotations

import time
from typing import Any

from potato_queue.config import LocalBackend, ProjectConfig, RayBackend
from potato_queue.errors import PotatoQueueError
from potato_queue.run import RunRecord
from potato_queue.store import RunStore
from potato_queue.store.keys import RunPaths
from potato_queue.store.records import created_ms
from potato_queue.wire.files import file_sha256
from potato_queue.wire.job import BundleRef, GpuWatch, Job, Limits

__all__ = ["build_job", "limits_for", "server_url_for", "heartbeat_interval_s", "max_predictions_bytes"]

SERVER_URL_WAIT_S = 2.5


def server_url_for(store: RunStore) -> str:
    """The address `potato-queue serve` is bound to, for the executors beside it (local, ssh forwards)."""
    deadline = time.monotonic() + 2 * SERVER_URL_WAIT_S
    url = store.presence.server_local_url()
    while url is None and time.monotonic() < deadline:  # the server re-records it every few seconds
        time.sleep(0.1)
        url = store.presence.server_local_url()
    if url is None:
        raise PotatoQueueError(
            "No potato-queue server is running for this project, so the agent has nothing to report to",
            fix="start it beside the executor: potato-queue serve CONFIG",
        )
    return url


def _params(config: ProjectConfig, store: RunStore, record: RunRecord) -> dict[str, Any]:
    params = dict(record.get("params") or {})
    if record["trainer"] == "decision-calibrate":
        base = store.latest_succeeded(exclude=record["run_id"])
        if base is None or not store.paths(base).predictions.exists():
            raise PotatoQueueError(
                "decision-calibrate recalibrates the latest successful run, and this project has none with predictions",
                fix="train a model first (e.g. sklearn-text), then calibrate it",
            )
        params["base_predictions"] = str(store.paths(base).predictions)
        params["base_run_id"] = base
    return params


MIB = 1024 * 1024


def heartbeat_interval_s(config: ProjectConfig, backend: str) -> float:
    """A sixth of the backend's heartbeat timeout, between 1 and 10 s, so a few lost beats do no harm."""
    return max(1.0, min(10.0, config.model_training.heartbeat_timeout_s_of(backend) / 6))


def max_predictions_bytes(config: ProjectConfig) -> int:
    return int(config.model_training.max_predictions_mb * MIB)


def build_job(config: ProjectConfig, store: RunStore, record: RunRecord, paths: RunPaths) -> Job:
    """Build and pack the bundle, then the job (kept in run.json as `job`, served to the agent as it is)."""
    from potato_queue.runs.retry import checkpoint_owner, reuse_bundle

    mt = config.model_training
    earlier = record.get("resume_of") or record.get("rerun_of")
    store.index.mark_bulky(record["run_id"], created_ms(record))  # before any file: retain_runs finds them all
    if earlier is not None:  # a retry, or a re-run, trains on the data the earlier run had
        manifest, said = reuse_bundle(config, store, record, paths), f"of run {earlier} reused"
        size, sha256 = paths.bundle.stat().st_size, file_sha256(paths.bundle)
    else:
        manifest, said, (size, sha256) = _built_or_cached(config, store, record, paths)
    store.log(
        record["run_id"],
        f"bundle {said}: {size} bytes, sha256 {sha256[:12]}",
        *(f"warning: {text}" for text in manifest["stats"]["warnings"]),
    )
    return Job(
        run_id=record["run_id"],
        trainer=record["trainer"],
        schemas=list(record["schemas"]),
        bundle=BundleRef(size, sha256),
        heartbeat_interval_s=heartbeat_interval_s(config, record["backend"]),
        max_predictions_bytes=max_predictions_bytes(config),
        params=_params(config, store, record),
        seed=_seed(store, record, mt.split_seed),
        grace_seconds=mt.grace_seconds,
        limits=limits_for(config, record["backend"]),
        resume_of=checkpoint_owner(store, record),
        gpu_watch=GpuWatch(**mt.gpu_watch.model_dump()),
        send_model_max_bytes=send_model_max_bytes(config, record["backend"]),
    )


def send_model_max_bytes(config: ProjectConfig, backend: str) -> int | None:
    """Whether the run's agent sends the model files to the server itself, and each file's cap: a ray run's does
    (nothing else reaches its node); the ssh executors fetch them, an agent backend's stay on its machine."""
    mt = config.model_training
    chosen = mt.backend_config(backend) if backend in mt.backend_names() else None
    if isinstance(chosen, RayBackend) and chosen.fetch_artifacts:
        return int(chosen.max_artifact_mb * 1_000_000)
    return None


def _seed(store: RunStore, record: RunRecord, split_seed: int) -> int:
    """The run's seed: a re-run's is its original's (the same run again), else the project's split_seed."""
    rerun_of = record.get("rerun_of")
    if rerun_of is None:
        return split_seed
    seed = (store.read(rerun_of).get("job") or {}).get("seed")
    return int(seed) if isinstance(seed, int) else split_seed


def _built_or_cached(
    config: ProjectConfig, store: RunStore, record: RunRecord, paths: RunPaths
) -> tuple[dict[str, Any], str, tuple[int, str]]:
    """The bundle of an earlier run built from the same inputs (bundle/inputs.py), copied; else built and
    packed. (manifest, what run.log says of it, (tar bytes, sha256))."""
    from potato_queue.bundle import build_bundle, pack_bundle
    from potato_queue.bundle.inputs import annotation_files, inputs_digest, write_inputs_file
    from potato_queue.runs.retry import copy_bundle

    annotations = annotation_files(config)  # before the digest: a file changed after it is read again later
    digest = inputs_digest(config, record["schemas"])
    for earlier in reversed(store.index.bulky_runs()):
        source = store.paths(earlier)
        if earlier == record["run_id"] or not _holds_bundle_of(source, digest):
            continue
        try:  # the earlier run's files may be pruned (retain_runs) while they are copied: then build
            manifest = copy_bundle(source, paths)
            packed = paths.bundle.stat().st_size, file_sha256(paths.bundle)
        except (OSError, ValueError):
            continue
        write_inputs_file(paths.bundle_inputs, digest, annotations)
        return (
            manifest,
            (
                f"of run {earlier} reused (its data files, annotations, config and split seed are "
                f"unchanged: inputs sha256 {digest[:12]})"
            ),
            packed,
        )
    manifest = build_bundle(config, paths.bundle_dir, schemas=record["schemas"])
    packed = pack_bundle(paths.bundle_dir, paths.bundle)
    if not (manifest.get("modality") == "image" and manifest["stats"].get("n_media_missing")):
        # An image bundle missing images (an address that could not be fetched) is not reused: the next run
        # builds again and fetches what is still missing (the rest comes from the media cache).
        write_inputs_file(paths.bundle_inputs, digest, annotations)
    return manifest, "built", packed


def _holds_bundle_of(paths: RunPaths, digest: str) -> bool:
    from potato_queue.bundle.inputs import read_inputs_file

    return (read_inputs_file(paths.bundle_inputs) or {}).get("digest") == digest and paths.bundle.is_file()


def limits_for(config: ProjectConfig, backend: str) -> Limits:
    """The local-run keys (device, num_threads, max_ram_mb) are the local backend's only: max_ram_mb 2000 suits
    the annotation VM and would kill a GPU host's fine-tune. A remote run gets its backend's num_threads."""
    mt = config.model_training
    chosen = mt.backend_config(backend) if backend in mt.backend_names() else None
    if isinstance(chosen, LocalBackend):
        return Limits(
            max_wall_s=mt.max_wall_seconds,
            max_ram_mb=chosen.max_ram_mb,
            device=chosen.device,
            num_threads=chosen.num_threads,
        )
    return Limits(
        max_wall_s=mt.max_wall_seconds, max_ram_mb=None, device="auto", num_threads=getattr(chosen, "num_threads", None)
    )

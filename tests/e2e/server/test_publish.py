"""Publishing a run's model to the Hugging Face Hub, from the API and from the run's page.

No hub is reachable from the machines the tests run on: tests/hub_standin.py stands in for the Hugging Face
Hub, a local server speaking the part of the Hub's HTTP API that huggingface_hub's create_repo and
upload_folder use (Xet off). The rest is real: Redis, `potato-queue serve` (HF_ENDPOINT pointing at the
stand-in), an executor, a tiny BERT trained with LoRA on the local backend, huggingface_hub itself, and
Debian's chromium for the page.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from potato_queue.run import RunState
from potato_queue.store import RunStore
from potato_queue.store.keys import Keys
from tests.e2e.server.test_page import browser, signed_in  # noqa: F401 - the fixture, and signing in as test_page does
from tests.hub_standin import HubStandIn
from tests.lifecycle_helpers import TERMINAL, Services, make_project, run_paths

REQUEST_TOKEN = "hf_requestTokenNeverStored0123456789abcd"
SERVER_TOKEN = "hf_serverTokenFromTheEnvironment987654321"
GPU_HOST = "gpu.example.org"
BACKENDS = {"gpu-server": {"type": "ssh", "host": GPU_HOST, "fetch_artifacts": False}}


@pytest.fixture(scope="module")
def hub() -> Iterator[HubStandIn]:
    """The stand-in for the Hugging Face Hub (none is reachable here), taking either write token."""
    stand_in = HubStandIn({REQUEST_TOKEN, SERVER_TOKEN})
    yield stand_in
    stand_in.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, hub: HubStandIn) -> Iterator[Services]:
    """The server (its HF_TOKEN the server's token, HF_ENDPOINT the stand-in) and an executor."""
    tmp = tmp_path_factory.mktemp("publish")
    svc = Services(make_project(tmp, backends=BACKENDS), redis_url=redis_server_url, tmp_path=tmp)
    hf_env = {
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": SERVER_TOKEN,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(tmp / "hf-home"),
    }
    svc.serve("127.0.0.1", env=hf_env)
    try:
        svc.executor()
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def svc(server: Services, tiny_model: Path) -> tuple[Services, str]:
    """The server and a run of hf-text-classification with LoRA that succeeded on the local backend, which no
    test but the API's publishes (the page test publishes a run of its own: tests may run in any order, on
    any xdist worker)."""
    run_id = server.start_run(
        trainer="hf-text-classification",
        schemas=["sentiment"],
        backend="local",
        params={"model_name": str(tiny_model), "epochs": 2, "batch_size": 8, "lora": True},
    )
    assert server.wait_for(run_id, TERMINAL, 180)["state"] == "succeeded", server.logs()
    return server, run_id


@pytest.fixture
def published_from_the_api(server: Services) -> str:
    """A run of its own that succeeded (majority-baseline: seconds, where a tiny BERT takes half a minute) and
    was published from the API to potato-lab/from-the-api, with the request's token."""
    run_id = server.start_run(trainer="majority-baseline", schemas=["sentiment"], backend="local")
    assert server.wait_for(run_id, TERMINAL, 120)["state"] == "succeeded", server.logs()
    status, reply = server.api(
        "POST", f"/runs/{run_id}/publish", {"repo_id": "potato-lab/from-the-api", "token": REQUEST_TOKEN}
    )
    assert status == 202, reply
    assert wait_published(server, run_id)["hub"]["state"] == "published", server.logs()
    return run_id


def wait_published(svc: Services, run_id: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = svc.api("GET", f"/runs/{run_id}/publish")[1]
        if status["hub"] and status["hub"]["state"] != "publishing":
            return status
        time.sleep(0.1)
    raise AssertionError(f"still publishing after {timeout_s} s: {svc.logs()}")


def redis_text(client: redis.Redis, prefix: str) -> str:
    """Every value under the project's keys, as text (to look for what must not be there)."""
    out = []
    for key in client.scan_iter(f"{prefix}:*"):
        kind = client.type(key).decode()
        value: Any = {
            "string": client.get,
            "hash": client.hgetall,
            "list": lambda k: client.lrange(k, 0, -1),
            "set": client.smembers,
            "zset": lambda k: client.zrange(k, 0, -1),
        }.get(kind, lambda k: b"")(key)
        out.append(f"{key!r} {value!r}")
    return "\n".join(out)


def test_a_run_is_published_with_its_files_and_a_model_card_and_the_token_is_never_stored(
    svc: tuple[Services, str], hub: HubStandIn, redis_server_url: str
) -> None:
    services, run_id = svc
    asked = len(hub.authorizations)  # the requests of this publish from here on (another test's may come before)
    assert services.api("GET", f"/runs/{run_id}/publish") == (
        200,
        {"run_id": run_id, "state": "succeeded", "hub": None, "refused": None},
    )
    status, reply = services.api(
        "POST", f"/runs/{run_id}/publish", {"repo_id": "potato-lab/reviews-sentiment", "token": REQUEST_TOKEN}
    )
    assert (status, reply["hub"]["state"], reply["hub"]["private"]) == (202, "publishing", True), reply
    hub_state = wait_published(services, run_id)["hub"]
    assert hub_state["state"] == "published", hub_state
    repo = hub.repos["potato-lab/reviews-sentiment"]
    assert hub_state["url"] == f"{hub.url}/potato-lab/reviews-sentiment"
    assert hub_state["revision"] == repo.commits[-1]
    assert repo.visibility == "private", "a new repo is private by default"
    assert set(hub.authorizations[asked:]) - {None} == {f"Bearer {REQUEST_TOKEN}"}, "the request's token, in the header"
    assert hub.unknown == []
    # The model files, byte for byte (the weights through the LFS batch API, the rest in the commit).
    artifacts = run_paths(services, run_id).artifacts
    files = {p.relative_to(artifacts).as_posix(): p.read_bytes() for p in artifacts.rglob("*") if p.is_file()}
    assert "sentiment/model.safetensors" in files
    assert {k: v for k, v in repo.files.items() if k != "README.md"} == files
    readme = repo.files["README.md"].decode()
    record = services.api("GET", f"/runs/{run_id}")[1]
    test_scores = record["held_out"]["sentiment"]["test"]
    assert readme.startswith("---\nlibrary_name: transformers\ntags:\n- potato-queue\n")
    assert "base_model" not in readme.split("---")[1], "a local folder is no Hub model"
    assert f"- Base model: a local folder ({Path(record['params']['model_name']).name})" in readme
    assert "- **sentiment** (model in `sentiment/`): " in readme and "positive" in readme and "negative" in readme
    assert (
        f"| sentiment | test | {test_scores['accuracy']:.4f} | {test_scores['macro_f1']:.4f} | {test_scores['n']} |"
    ) in readme
    assert "- LoRA: r=8, alpha=16, dropout=0.1, target modules: the peft default for the model" in readme
    assert f"| train | {record['bundle']['n']['train']} |" in readme
    assert str(artifacts.parent) not in readme, "no path of the server's"
    paths = run_paths(services, run_id)
    log = paths.run_log.read_text()
    assert f"published to {hub_state['url']} (revision {hub_state['revision']})" in log
    assert json.loads(paths.run_json.read_text())["hub"]["url"] == hub_state["url"]
    assert not paths.hub_upload.exists()
    # The token: in none of the run's files, Redis or the server's log.
    for path in paths.dir.rglob("*"):
        if path.is_file():
            assert REQUEST_TOKEN.encode() not in path.read_bytes(), path
    prefix = Keys.of(services.project_config).prefix
    assert REQUEST_TOKEN not in redis_text(redis.Redis.from_url(redis_server_url), prefix)
    assert REQUEST_TOKEN not in (services.tmp_path / "server.log").read_text()


def test_a_repo_id_the_hub_refuses_is_a_400_that_names_it(svc: tuple[Services, str]) -> None:
    services, run_id = svc
    status, reply = services.api("POST", f"/runs/{run_id}/publish", {"repo_id": "no-namespace"})
    assert (status, reply["detail"]) == (
        400,
        (
            "'no-namespace' is not a Hugging Face Hub repo id; fix: write it as namespace/name (your user or "
            "organization, then the model's name), in letters, digits, - _ and . (not -- nor .., not first or last), "
            "at most 96 characters: e.g. my-lab/reviews-sentiment"
        ),
    )
    # A newline after a good id (a regular expression's `$` matches before one) is no id either.
    for bad in ("my-lab/reviews\n", "my-lab/reviews\nx", "\nmy-lab/reviews"):
        status, reply = services.api("POST", f"/runs/{run_id}/publish", {"repo_id": bad})
        assert (status, reply["detail"].split(";")[0]) == (400, f"{bad!r} is not a Hugging Face Hub repo id")


def ssh_run_that_kept_its_files_there(services: Services, redis_url: str) -> tuple[str, str]:
    """A run on the ssh backend (fetch_artifacts: false) that succeeded, recorded as its executor records it:
    the model files' place on the host as its artifact_uri."""
    store = RunStore(services.project_config, redis.Redis.from_url(redis_url))
    run_id = store.create(trainer="majority-baseline", schemas=["sentiment"], backend="gpu-server")["run_id"]
    where = f"/home/me/.cache/potato-training/{run_id}/work"
    for state in (RunState.STARTING, RunState.RUNNING, RunState.COLLECTING):
        assert store.transition(run_id, state)
    assert store.transition(run_id, RunState.SUCCEEDED, artifact_uri=f"{GPU_HOST}:{where}")
    return run_id, where


def test_a_run_whose_model_files_stayed_on_the_gpu_host_is_refused_with_why_and_the_fix(
    server: Services, redis_server_url: str
) -> None:
    services = server
    run_id, where = ssh_run_that_kept_its_files_there(services, redis_server_url)
    artifacts = run_paths(services, run_id).artifacts
    message = (
        f"The model files of run {run_id} stayed on {GPU_HOST} at {where}: only model files on this server "
        f"can be published"
    )
    fix = (
        f"copy them here (scp -r {GPU_HOST}:{where}/. {artifacts}/), then publish again; backend gpu-server "
        f"copies later runs' files back with fetch_artifacts: true (the default)"
    )
    status, reply = services.api("POST", f"/runs/{run_id}/publish", {"repo_id": "potato-lab/on-the-gpu"})
    assert (status, reply) == (409, {"detail": f"{message}; fix: {fix}"})
    assert services.api("GET", f"/runs/{run_id}/publish")[1]["refused"] == {"message": message, "fix": fix}


def test_the_run_page_publishes_with_the_servers_token_and_links_the_model(
    browser: Any,  # noqa: F811 - the fixture
    server: Services,
    published_from_the_api: str,
    hub: HubStandIn,  # noqa: F811
    redis_server_url: str,
) -> None:
    services, run_id = server, published_from_the_api
    page = signed_in(browser, services)
    page.goto(f"{services.url}/admin/training/runs/{run_id}")
    page.wait_for_selector("#hub-state a", timeout=30000)
    assert page.is_checked("#hub-private"), "private by default"
    assert "not stored; leave empty to use the server's HF_TOKEN" in page.text_content("#hub-token-hint")
    # The run was published from the API already: the page links that repo until this publish ends.
    assert page.get_attribute("#hub-state a", "href") == f"{hub.url}/potato-lab/from-the-api"
    page.fill("#hub-repo", "potato-lab/from-the-page")
    page.click("#hub-publish")
    url = f"{hub.url}/potato-lab/from-the-page"
    page.wait_for_function(f"() => document.querySelector('#hub-state a')?.href === {json.dumps(url)}", timeout=60000)
    assert page.get_attribute("#hub-state a", "href") == url
    assert page.text_content("#hub-state").startswith(f"Published to {url} (private), revision ")
    assert hub.repos["potato-lab/from-the-page"].visibility == "private"
    assert f"Bearer {SERVER_TOKEN}" in hub.authorizations, "an empty token field: the server's HF_TOKEN"
    # A run whose files stayed on the GPU host: the reason, no form.
    other, _ = ssh_run_that_kept_its_files_there(services, redis_server_url)
    page.goto(f"{services.url}/admin/training/runs/{other}")
    page.wait_for_selector("#hub-refused", state="visible", timeout=30000)
    assert page.text_content("#hub-refused").startswith(f"The model files of run {other} stayed on {GPU_HOST} at ")
    assert page.is_hidden("#hub-form")


@pytest.mark.unit
def test_the_model_card_names_a_hub_base_model_and_every_lora_setting(tmp_path: Path) -> None:
    """The card of a trainer whose model_card.json has the shared shape (hf-llm-lora's: a Hub base model,
    LoRA with its target modules), its front matter YAML the Hub reads."""
    import yaml

    from potato_queue.runs.model_card import model_card
    from potato_queue.validate import load_checked

    config = load_checked(make_project(tmp_path))
    record: Any = {
        "run_id": "20260101T000000-abcdef",
        "trainer": "hf-llm-lora",
        "schemas": ["sentiment"],
        "params": {"model_name": "Qwen/Qwen2.5-0.5B"},
        "finished_at": "2026-01-01T00:10:00.000Z",
        "bundle": {"n": {"train": 80, "val": 20, "test": 20}},
        "held_out": {
            "sentiment": {
                "val": {"accuracy": 0.9, "macro_f1": 0.8889, "n": 20},
                "test": {"accuracy": None, "macro_f1": None, "n": 0},
            }
        },
    }
    card = {
        "trainer": "hf-llm-lora",
        "schemas": {"sentiment": {"label_order": ["negative", "positive"]}},
        "settings": {
            "model_name": "Qwen/Qwen2.5-0.5B",
            "epochs": 1,
            "packaged_folder": "/srv/models/qwen",
            "lora": {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
        },
    }
    text = model_card(record, card, config, "potato-lab/reviews-llm")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front == {
        "library_name": "transformers",
        "tags": ["potato-queue", "potato-annotation", "hf-llm-lora"],
        "base_model": "Qwen/Qwen2.5-0.5B",
    }
    assert "- Base model: Qwen/Qwen2.5-0.5B\n" in text
    assert "- LoRA: r=16, alpha=32, dropout=0.05, target modules: q_proj, v_proj\n" in text
    assert "- **sentiment**: negative, positive\n" in text
    assert "| sentiment | val | 0.9000 | 0.8889 | 20 |\n| sentiment | test | n/a | n/a | 0 |" in text
    assert "| train | 80 |\n| val | 20 |\n| test | 20 |" in text
    assert "/srv/models" not in text, "a folder of the training machine is not the model"

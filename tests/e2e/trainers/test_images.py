"""Images: a project whose items are pictures (circles and squares, drawn here), trained by
hf-image-classification for real.

A tiny ViT is built from a config (no download) and fine-tuned on the CPU through the queue (a real
server, Redis, executor and agent on the local backend, and the ssh backend against a real sshd, where
the pictures travel inside the bundle); a radio scheme (the shape) and a multiselect (the colours).
Five labelled items have an image no machine can read, a file gone, a URL that does not answer, a
decompression bomb, a file cut short and one that is no image: the run names each in run.log and goes on. A text trainer is refused before the run is queued.
"""

from __future__ import annotations

import json
import random
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.server.test_page import browser, signed_in  # noqa: F401, F811 - browser: the fixture, one chromium for the module
from tests.e2e.ssh.test_ssh_backend import BACKEND, gpu_server
from tests.lifecycle_helpers import ADMIN_KEY, TERMINAL, Services, make_project, run_paths, started
from tests.sshd import Sshd
from tests.unit.test_hostile_images import BOMB_SIDE, bomb_png

SIZE = 32
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220)}
SCHEMES = [
    {"annotation_type": "radio", "name": "shape", "description": "Which shape?", "labels": ["circle", "square"]},
    {"annotation_type": "multiselect", "name": "colours", "description": "Which colours?", "labels": ["red", "blue"]},
]
GONE, UNREACHABLE = "p900", "p901"  # labelled items whose image cannot be read
BOMB, CUT, GARBAGE = "p902", "p903", "p904"  # ... and whose file is hostile (tests/unit/test_hostile_images.py)


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide ViT over 32x32 pictures in 8x8 patches, with its image processor: built here."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    folder = tmp_path_factory.mktemp("tiny-vit")
    config = ViTConfig(
        image_size=SIZE,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=2,
    )
    ViTForImageClassification(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    return folder


def test_hf_image_classification_learns_shapes_and_colours_and_names_the_images_it_cannot_read(
    tmp_path: Path, redis_server_url: str, tiny_vit: Path
) -> None:
    with images_stack(tmp_path, redis_server_url) as svc:
        status, refused = svc.api("POST", "/runs", {"trainer": "sklearn-text", "schemas": ["shape"]})
        assert status == 409, refused
        assert refused["detail"].startswith(
            "The items of shape are of the image modality (Potato's rule: most items "
            "name a file of that kind), and sklearn-text trains on text items"
        ), refused
        assert "train them with hf-image-classification or majority-baseline" in refused["detail"], refused
        run_id = svc.start_run(
            trainer="hf-image-classification",
            schemas=["shape", "colours"],
            params={"model_name": str(tiny_vit), "epochs": 20, "batch_size": 16, "learning_rate": 3e-3},
        )
        run = svc.wait_for(run_id, TERMINAL, 300)
        log = run_paths(svc, run_id).run_log.read_text()
        assert run["state"] == "succeeded", (run, log)
        held = run["held_out"]
        assert held["shape"]["test"]["accuracy"] >= 0.8 and held["colours"]["test"]["micro_f1"] >= 0.8, held
        assert f"{GONE} (its file images/{GONE}.png was missing when the bundle was built)" in log, log
        # The server fetches an image run's addresses (never the host), and names the one it could not fetch.
        assert (
            f"could not be fetched by the server: item {UNREACHABLE} (http://127.0.0.1:9/{UNREACHABLE}.png): "
            "cannot be reached" in log
        ), log
        assert f"{UNREACHABLE} (its image http://127.0.0.1:9/{UNREACHABLE}.png could not be fetched when" in log, log
        assert f"/{BOMB}.png is {BOMB_SIDE}x{BOMB_SIDE} pixels, over the 40,000,000 an image may have" in log
        assert f"/{CUT}.png cannot be read here (OSError: image file is truncated)" in log, log
        assert f"/{GARBAGE}.png cannot be read here (UnidentifiedImageError: cannot identify" in log, log
        lines = [json.loads(x) for x in run_paths(svc, run_id).predictions.read_text().splitlines()]
        unread = {GONE, UNREACHABLE, BOMB, CUT, GARBAGE}
        assert not unread & {p["instance_id"] for p in lines}, "no prediction without an image"
        shapes = [p for p in lines if p["schema_name"] == "shape"]
        assert shapes and all(p["payload"]["label"] in ("circle", "square") for p in shapes)
        assert all(isinstance(p["payload"], list) for p in lines if p["schema_name"] == "colours")
        saved = run_paths(svc, run_id).artifacts
        assert (saved / "shape" / "preprocessor_config.json").is_file() and (
            saved / "colours" / "thresholds.json"
        ).is_file()


def test_an_image_project_trains_on_the_ssh_backend_with_its_pictures_in_the_bundle(
    tmp_path: Path, redis_server_url: str, sshd: Sshd, tiny_vit: Path
) -> None:
    sshd.write_config("root")
    with images_stack(
        tmp_path,
        redis_server_url,
        {"POTATO_QUEUE_SSH_CONFIG": str(sshd.config)},
        **gpu_server(tmp_path, python=sys.executable),
    ) as svc:
        run_id = svc.start_run(
            trainer="hf-image-classification",
            schemas=["shape"],
            backend=BACKEND,
            params={
                "model_name": str(tiny_vit),
                "epochs": 3,
                "batch_size": 16,
                "learning_rate": 3e-3,
                "lora": {"r": 4, "alpha": 8},
            },
        )  # LoRA on the ViT's attention, its head trained in full
        run = svc.wait_for(run_id, TERMINAL, 300)
        assert run["state"] == "succeeded" and run["ran_on"] == BACKEND, (run, svc.logs())
        assert run["held_out"]["shape"]["test"]["n"] > 0
        assert (run_paths(svc, run_id).artifacts / "shape" / "config.json").is_file(), "the model came back"
        saved = run_paths(svc, run_id).artifacts / "shape"
        assert not (saved / "adapter_config.json").exists(), "the adapter is merged into a plain model"


def images_stack(
    tmp_path: Path, redis_url: str, executor_env: dict[str, str] | None = None, **training: Any
) -> AbstractContextManager[Services]:
    """The small project with its scheme added, its server and an executor."""
    return started(tmp_path, redis_url, prepare=make_image_project, executor_env=executor_env, **training)


def draw(path: Path, shape: str, colour: str, second: str | None, rng: random.Random) -> None:
    """A white picture with one filled circle or square, and maybe a small dot of a second colour in a corner."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(image)
    half = rng.randint(10, 12)  # near the middle: a square's corners fill the patches a circle leaves white
    x, y = SIZE // 2 + rng.randint(-1, 1), SIZE // 2 + rng.randint(-1, 1)
    box = (x - half, y - half, x + half, y + half)
    (pen.ellipse if shape == "circle" else pen.rectangle)(box, fill=COLOURS[colour])
    if second:
        pen.rectangle((0, 0, 4, 4), fill=COLOURS[second])
    image.save(path)


def make_image_project(config: Path, n: int = 140, seed: int = 0) -> None:
    """The project becomes pictures: `n` drawn items (every seventh unlabelled), one answer each, as Potato stores a
    radio's and a multiselect's; and the two labelled items whose image cannot be read."""
    project, rng = config.parent, random.Random(seed)
    (project / "images").mkdir()
    items, answers = [], {}
    for i in range(n):
        iid, shape, colour = f"p{i:03d}", rng.choice(["circle", "square"]), rng.choice(list(COLOURS))
        second = next(c for c in COLOURS if c != colour) if i % 3 == 0 else None
        draw(project / "images" / f"{iid}.png", shape, colour, second, rng)
        items.append({"id": iid, "image": f"images/{iid}.png"})
        if i % 7 != 6:
            answers[iid] = [[{"schema": "shape", "name": shape}, shape]] + [
                [{"schema": "colours", "name": c}, c] for c in sorted({colour, second} - {None})
            ]
    (project / "images" / f"{BOMB}.png").write_bytes(bomb_png(BOMB_SIDE))
    whole = (project / "images" / "p000.png").read_bytes()
    (project / "images" / f"{CUT}.png").write_bytes(whole[: len(whole) // 2])
    (project / "images" / f"{GARBAGE}.png").write_bytes(b"\x89PNG no image here \x00\xff" * 40)
    items += [
        {"id": GONE, "image": f"images/{GONE}.png"},
        {"id": UNREACHABLE, "image": f"http://127.0.0.1:9/{UNREACHABLE}.png"},
        *({"id": iid, "image": f"images/{iid}.png"} for iid in (BOMB, CUT, GARBAGE)),
    ]
    for iid in (GONE, UNREACHABLE, BOMB, CUT, GARBAGE):
        answers[iid] = [
            [{"schema": "shape", "name": "circle"}, "circle"],
            [{"schema": "colours", "name": "red"}, "red"],
        ]
    (project / "data" / "pictures.json").write_text(json.dumps(items))
    data = yaml.safe_load(config.read_text())
    data.update(
        data_files=["data/pictures.json"],
        annotation_schemes=SCHEMES,
        item_properties={"id_key": "id", "text_key": "image"},
    )
    data["model_training"]["writeback"]["schemas"] = ["shape"]
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    for folder in (project / "annotation_output").iterdir():
        folder.joinpath("user_state.json").write_text(
            json.dumps(
                {"user_id": folder.name, "instance_id_to_label_to_value": answers, "instance_id_to_span_to_value": {}}
            )
        )


def test_validate_and_the_page_offer_a_text_trainer_nothing_of_an_image_project(
    tmp_path: Path,
    redis_server_url: str,
    browser: Any,  # noqa: F811 - the fixture
) -> None:
    from potato_queue.validate import check_file

    config = make_project(tmp_path, auto_retrain={"enabled": True, "trainer": "sklearn-text"})
    make_image_project(config, n=20)
    assert (
        "model_training.auto_retrain.trainer is sklearn-text, which trains on text items, and this project's items "
        "are of the image modality: every auto run would be refused; pick a trainer that takes image items"
    ) in check_file(config).errors
    data = yaml.safe_load(config.read_text())
    data["model_training"]["auto_retrain"]["trainer"] = "hf-image-classification"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    assert check_file(config).errors == []
    svc = Services(config, redis_server_url, tmp_path)
    svc.serve()
    try:
        page = signed_in(browser, svc)
        page.select_option("#trainer", "sklearn-text")
        why = page.text_content("label[for='schema-shape'] .schema-why")
        assert why == " (image items: sklearn-text trains on text items)" and page.is_disabled("#schema-shape")
        page.select_option("#trainer", "hf-image-classification")
        page.wait_for_function("() => !document.querySelector('#schema-shape').disabled")
        assert page.is_checked("#schema-shape") and page.is_checked("#schema-colours")
        page.close()
    finally:
        svc.stop()


def test_potatos_image_example_trains_on_images_the_server_fetched_once_from_addresses_without_extension(
    tmp_path: Path, redis_server_url: str, tiny_vit: Path
) -> None:
    """Potato's image-classification example lists web addresses without an extension (unsplash's
    `photo-...?w=800`), here on a loopback image host: the server fetches each address once into the bundle
    (ten items share each address: five requests), and the worker trains on the files, never fetching."""
    from tests.potato_examples import example_project
    from tests.unit.test_remote_images import _Images, serving

    with serving() as host:
        config = example_project("image-classification", tmp_path / "project", top={"admin_api_key": ADMIN_KEY})
        data = config.parent / "data" / "images.json"
        originals = [json.loads(line) for line in data.read_text().splitlines()]
        items = [
            {**item, "id": f"{item['id']}_{copy}", "image_url": f"{host}/photo-{n}?w=800"}
            for copy in range(10)
            for n, item in enumerate(originals)
        ]
        data.write_text("".join(json.dumps(item) + "\n" for item in items))
        for state in (config.parent / "annotation_output").rglob("user_state.json"):
            answers = {
                item["id"]: [[{"schema": "category", "name": label}, label]]
                for n, item in enumerate(items)
                for label in [("nature", "urban")[n % 2]]
            }
            state.write_text(json.dumps({"user_id": state.parent.name, "instance_id_to_label_to_value": answers}))
        svc = Services(config, redis_server_url, tmp_path)
        try:
            svc.serve()
            svc.executor()
            params = {"model_name": str(tiny_vit), "epochs": 2, "batch_size": 16}
            run_id = svc.start_run(trainer="hf-image-classification", schemas=["category"], params=params)
            run = svc.wait_for(run_id, TERMINAL, 300)
            assert run["state"] == "succeeded", (run, svc.logs())
        finally:
            svc.stop()
        assert sorted(_Images.served) == sorted(f"/photo-{n}?w=800" for n in range(len(originals)))
    assert run["held_out"]["category"]["test"]["n"] > 0
    assert "cannot be read here" not in run_paths(svc, run_id).run_log.read_text()

"""Images given as web addresses (Potato's image example: no extension, a query string) are images, fetched by
the server into the bundle once, bounded, and never by the training host. A real HTTP server on loopback
stands in for the image host."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from potato_queue.bundle import build_bundle, project_modality
from potato_queue.bundle.remote_media import FetchLimits, fetch_images
from potato_queue.errors import Conflict
from potato_queue.runs.kinds import refuse_foreign_modality
from potato_queue.validate import load_checked
from tests.potato_examples import example_project

pytestmark = pytest.mark.unit


def _png(colour: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, format="PNG")
    return out.getvalue()


class _Images(BaseHTTPRequestHandler):
    served: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).served.append(self.path)
        if self.path.startswith("/gone"):
            self.send_error(404)
            return
        body = b"<html>not an image</html>" if self.path.startswith("/page") else _png("red")
        if self.path.startswith("/huge"):
            body = body + b"\0" * 3000
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if self.path.startswith("/page") else "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving() -> Iterator[str]:
    """The image host on loopback, its address; `_Images.served` lists what it was asked for."""
    _Images.served = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def image_host() -> Iterator[str]:
    with serving() as host:
        yield host


def _image_project(tmp_path: Path, host: str) -> Path:
    """Potato's image-classification example, its unsplash addresses moved to the loopback host, shape kept."""
    config_path = example_project("image-classification", tmp_path / "project")
    data = tmp_path / "project" / "data" / "images.json"
    items = [json.loads(line) for line in data.read_text().splitlines()]
    for n, item in enumerate(items):
        item["image_url"] = f"{host}/photo-15069{n}?w=800"
    items[4]["image_url"] = f"{host}/gone-1480714378408?w=800"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    return config_path


def test_addresses_without_an_extension_shown_as_images_are_images_fetched_once_into_the_bundle(
    tmp_path: Path, image_host: str
) -> None:
    config = load_checked(_image_project(tmp_path, image_host))
    assert project_modality(config) == "image", "Potato's rule alone says text: no extension"
    with pytest.raises(Conflict, match="are of the image modality"):
        refuse_foreign_modality(config, "sklearn-text", ["category"])
    manifest = build_bundle(config, tmp_path / "bundle", ["category"])
    assert manifest["modality"] == "image"
    rows = [json.loads(x) for s in ("train", "val", "test") for x in (tmp_path / "bundle" / f"{s}.jsonl").open()]
    linked = [row for row in rows if "media" in row]
    assert len(linked) == 4 and all((tmp_path / "bundle" / "media" / row["media"]).is_file() for row in linked)
    assert [row["media_missing"] for row in rows if "media_missing" in row] == [
        f"{image_host}/gone-1480714378408?w=800"
    ]
    (warning,) = [w for w in manifest["stats"]["warnings"] if "could not be fetched" in w]
    assert f"item img_005 ({image_host}/gone-1480714378408?w=800): HTTP 404" in warning, warning
    first = len(_Images.served)
    build_bundle(config, tmp_path / "again", ["category"])
    assert len(_Images.served) - first == 1, "the next bundle fetches only what failed before"
    cached = list((tmp_path / "project" / "annotation_output" / "training" / "media_cache").rglob("*.png"))
    assert len(cached) == 4 and all(p.stat().st_mode & 0o077 == 0 for p in cached), "0600, the server's alone"


def test_what_the_server_fetches_is_bounded_and_each_refusal_says_why(tmp_path: Path, image_host: str) -> None:
    limits = FetchLimits(max_image_bytes=1000, timeout_s=5, max_new_images=2)
    urls = [f"{image_host}/huge", f"{image_host}/page", f"{image_host}/ok-1", f"{image_host}/ok-2"]
    fetched = fetch_images(urls, tmp_path / "cache", limits)
    assert fetched.failed == {
        f"{image_host}/huge": "the image is over 0 MB",
        f"{image_host}/page": "the address answered text/html, not an image",
        f"{image_host}/ok-1": "over the 2 new images one bundle fetches; run again",
        f"{image_host}/ok-2": "over the 2 new images one bundle fetches; run again",
    }
    assert fetched.n_fetched == 0 and not fetched.files


def test_a_text_project_with_an_image_address_beside_its_text_fetches_nothing(tmp_path: Path, image_host: str) -> None:
    config_path = example_project("single-choice", tmp_path / "project")
    data = tmp_path / "project" / "data" / "toy-example.json"
    items = [json.loads(line) for line in data.read_text().splitlines()]
    data.write_text(
        "".join(json.dumps({**item, "image_url": f"{image_host}/x{n}"}) + "\n" for n, item in enumerate(items))
    )
    config = yaml.safe_load(config_path.read_text())
    manifest = build_bundle(load_checked(config_path), tmp_path / "bundle")
    assert manifest["modality"] == "text" and _Images.served == [], config["annotation_schemes"][0]["name"]


def test_an_address_with_a_space_is_fetched_and_a_malformed_one_is_a_named_failure(
    tmp_path: Path, image_host: str
) -> None:
    fetched = fetch_images([f"{image_host}/my photo 1", "http://[::1/broken"], tmp_path / "cache")
    assert list(fetched.files) == [f"{image_host}/my photo 1"] and _Images.served == ["/my%20photo%201"]
    assert list(fetched.failed) == ["http://[::1/broken"], "one bad address is that item's failure, not the bundle's"

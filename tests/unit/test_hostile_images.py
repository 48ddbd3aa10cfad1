"""Images a project may hold that no training should choke on (issue 51): a decompression bomb (a few KB of PNG
that decodes to hundreds of MB), a file cut short, and bytes that are no image. hf-image-classification's
read_image names each, per item, without decoding the bomb: its memory stays bounded (measured in a child
process, whose peak RSS is its own)."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zlib

import pytest

from potato_queue.trainers.hf_image import MAX_IMAGE_PIXELS, read_image
from potato_queue.worker.bundle import Bundle

pytestmark = pytest.mark.unit

BOMB_SIDE = 12_000  # 144 megapixels: under PIL's own refusal (178), so PIL alone decodes it (432 MB as RGB)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(side: int) -> bytes:
    """A black 1-bit PNG of side x side: a few tens of KB on disk."""
    rows = (b"\x00" + b"\x00" * ((side + 7) // 8)) * side
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows, 9)) + _chunk(b"IEND", b"")
    )


def small_png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.effect_noise((64, 64), 80).convert("RGB").save(out, "PNG")  # noise: it does not compress away
    return out.getvalue()


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("bundle")
    (root / "media").mkdir()
    (root / "media" / "bomb.png").write_bytes(bomb_png(BOMB_SIDE))
    whole = small_png()
    (root / "media" / "cut.png").write_bytes(whole[: len(whole) // 2])
    (root / "media" / "garbage.png").write_bytes(b"\x89PNG this is not an image \x00\xff" * 40)
    (root / "media" / "fine.png").write_bytes(whole)
    return Bundle(str(root), {"media_dir": "media"}, {})


def test_a_bomb_a_cut_file_and_garbage_are_each_named_and_a_good_image_read(media: Bundle) -> None:
    def why(name: str) -> str | None:
        return read_image(media, {"instance_id": name, "media": f"{name}.png"})[1]

    assert why("bomb") == (
        f"{media.media_dir}/bomb.png is {BOMB_SIDE}x{BOMB_SIDE} pixels, over the {MAX_IMAGE_PIXELS:,} an image may "
        "have here (a decompression bomb, or a picture far larger than a classifier needs: downscale it)"
    )
    assert why("cut") == f"{media.media_dir}/cut.png cannot be read here (OSError: image file is truncated)"
    garbage = f"{media.media_dir}/garbage.png"
    assert (
        why("garbage")
        == f"{garbage} cannot be read here (UnidentifiedImageError: cannot identify image file {garbage!r})"
    )
    image, fine = read_image(media, {"instance_id": "fine", "media": "fine.png"})
    assert fine is None and image.size == (64, 64) and image.mode == "RGB"


def test_reading_the_bomb_keeps_memory_bounded(media: Bundle) -> None:
    """In a child (peak RSS is per process): reading the bomb costs well under what decoding it would, 432 MB."""
    script = (
        "import json, resource, sys\n"
        "from potato_queue.trainers.hf_image import read_image\n"
        "from potato_queue.worker.bundle import Bundle\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "image, why = read_image(Bundle(sys.argv[1], {'media_dir': 'media'}, {}), {'media': 'bomb.png'})\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'grew_kb': after - before, 'read': image is not None}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, media.root], capture_output=True, text=True, timeout=120, check=True
    )
    measured = json.loads(out.stdout.splitlines()[-1])
    assert not measured["read"] and measured["grew_kb"] < 50_000, measured  # decoding it: over 400,000 KB

"""An image run's images given as web addresses, fetched by the server into the bundle, never by the host.

Potato's image example lists its images as URLs; a GPU host often has no route to the internet, and a trainer
that fetches them itself fails there, or fetches the same corpus again for every run. So the server that
builds the bundle fetches each address once, bounded (bytes per image, seconds per request, images per
build), into the project's media cache (store/keys.media_cache_dir, one file per address's sha256), and the
bundle links the cached file as it links a local one. The next run's bundle finds them there and fetches
nothing. An address that fails is no error of the run: its row keeps the address as `media_missing`, and the
bundle's warnings name the item, the address and why (the image trainer then names what it could not read).
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from potato_queue.wire.files import write_atomic

__all__ = ["FetchLimits", "Fetched", "fetch_images"]

_SUFFIX_OF_TYPE = {
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "image/bmp": ".bmp",
    "image/tiff": ".tif",
}
_PARALLEL = 8  # requests at once: a slow host delays a handful of images, not the build
_USER_AGENT = "potato-queue (fetching an image run's images into its bundle)"


@dataclass(frozen=True)
class FetchLimits:
    """What one build may fetch: bytes per image, seconds per request (each read), new images per build, and
    seconds in all."""

    max_image_bytes: int = 20_000_000
    timeout_s: float = 20.0
    max_new_images: int = 20_000
    max_total_s: float = 900.0  # a slow host's trickle ends too: what is fetched by then is cached


@dataclass
class Fetched:
    """Per address, the cached file or why it could not be fetched; how many came from the network."""

    files: dict[str, Path] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    n_fetched: int = 0


def _cached(cache_dir: Path, url: str) -> Path | None:
    stem = hashlib.sha256(url.encode()).hexdigest()
    folder = cache_dir / stem[:2]
    try:
        return next(folder.glob(f"{stem}.*"), None)
    except OSError:
        return None


def _fetch_one(url: str, cache_dir: Path, limits: FetchLimits) -> Path:
    """The image at `url`, in the cache; an exception saying why not."""
    # A space or other character a data file leaves unescaped is quoted, as a browser does.
    quoted = urllib.parse.quote(url, safe=":/?#[]@!$&'()*+,;=%~")
    request = urllib.request.Request(quoted, headers={"User-Agent": _USER_AGENT})
    with urllib.request.urlopen(request, timeout=limits.timeout_s) as answer:  # noqa: S310 - http(s) only
        kind = str(answer.headers.get_content_type() or "")
        if not kind.startswith("image/"):
            raise ValueError(f"the address answered {kind or 'no content type'}, not an image")
        data = answer.read(limits.max_image_bytes + 1)
    if len(data) > limits.max_image_bytes:
        raise ValueError(f"the image is over {limits.max_image_bytes // 1_000_000} MB")
    stem = hashlib.sha256(url.encode()).hexdigest()
    path = cache_dir / stem[:2] / f"{stem}{_SUFFIX_OF_TYPE.get(kind, '.img')}"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, data, mode=0o600)
    return path


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return f"cannot be reached ({exc.reason})"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__


def fetch_images(urls: Iterable[str], cache_dir: Path, limits: FetchLimits = FetchLimits()) -> Fetched:
    """Every address in the cache, fetching those it lacks (at most limits.max_new_images of them)."""
    fetched, missing = Fetched(), list[str]()
    for url in dict.fromkeys(urls):
        found = _cached(cache_dir, url)
        if found is not None:
            fetched.files[url] = found
        elif len(missing) < limits.max_new_images:
            missing.append(url)
        else:
            fetched.failed[url] = f"over the {limits.max_new_images} new images one bundle fetches; run again"
    if not missing:
        return fetched
    os.makedirs(cache_dir, mode=0o700, exist_ok=True)

    deadline = time.monotonic() + limits.max_total_s

    def attempt(url: str) -> tuple[str, Path | None, str]:
        if time.monotonic() > deadline:
            return url, None, f"the server's {limits.max_total_s:.0f} s for fetching images ran out; run again"
        try:
            return url, _fetch_one(url, cache_dir, limits), ""
        except Exception as exc:  # noqa: BLE001 - any address's failure is that item's, never the bundle's
            return url, None, _why(exc)

    with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(missing))) as pool:
        for url, path, why in pool.map(attempt, missing):
            if path is None:
                fetched.failed[url] = why
            else:
                fetched.files[url] = path
                fetched.n_fetched += 1
    return fetched

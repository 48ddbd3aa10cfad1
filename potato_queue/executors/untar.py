"""A host's tar stream into the run's artifacts/, as regular files and folders only: the receiving side's rules.

A GPU host is a machine the server does not control: its tar may hold symbolic
links (`config.json -> /etc/shadow`), hard links, device nodes, FIFOs, names
climbing out with `..`, or more bytes than it announced. The system tar stops
some of these and creates the rest; Python's tarfile with its "data" filter
stops others. So neither extracts: this module reads the stream's headers
itself (ustar, GNU long names, pax) and writes only

- a regular file the sender's manifest announced, with exactly its announced
  size, at most the backend's max_artifact_mb, once;
- a folder on the way to such a file;

each created here (O_EXCL|O_NOFOLLOW, 0600 files in 0700 folders), so nothing
can be written through a link. Anything else raises CopyRefused, naming the
entry; the caller removes what arrived. The file bytes move from ssh's pipe to
the file with splice(2) where the kernel has it: no Python in the data path,
which on a small server is what the copy's speed is (P5).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from potato_queue.errors import PotatoQueueError
from potato_queue.settings import FREE_MARGIN_BYTES

__all__ = [
    "CopyRefused",
    "CopyCutShort",
    "manifest_of",
    "check_manifest",
    "extract",
    "unpack_upload",
    "MAX_FILES",
    "MAX_NAME_BYTES",
]

BLOCK = 512
MAX_FILES = 100_000
MAX_NAME_BYTES = 4096
MAX_META_BYTES = 1 << 20  # a pax header or GNU long name: a name's worth, not a file's
MAX_TRAILER_BYTES = 1 << 20
MAX_NOTE_BYTES = (
    64 << 20
)  # the manifest of MAX_FILES files with long names fits  # what may follow the end-of-archive blocks (tar pads to its record size)
COPY_CHUNK_BYTES = 1 << 20
REGULAR = (b"0", b"\0", b"7")
KINDS = {
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a character device",
    b"4": "a block device",
    b"6": "a FIFO",
    b"S": "a sparse file",
    b"K": "a long link name",
    b"V": "a volume label",
    b"M": "a multi-volume part",
    b"N": "an old GNU long name",
    b"D": "a GNU dump folder",
}


class CopyRefused(PotatoQueueError):
    """The stream holds something that must not land on the server; the message names it."""


class CopyCutShort(PotatoQueueError):
    """The stream ended early: the sender died or its ssh broke, no sign of a lie."""


def manifest_of(note: Any) -> dict[str, int] | None:
    """The sender's {"manifest": {name: bytes}} note checked for shape; None when it is not one."""
    files = note.get("manifest") if isinstance(note, dict) else None
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        return None
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in files.values()):
        return None
    return {str(name): size for name, size in files.items()}


def check_manifest(manifest: Mapping[str, int], limit_bytes: int, dest: Path) -> None:
    """Refuses, before a byte is written, what the sender announced and must not get: a bad name, a
    file over the limit (the sender keeps those on the host), more than this server's disk has free."""
    for name, size in manifest.items():
        _safe_name(name)
        if size > limit_bytes:
            raise CopyRefused(
                f"{name} is announced with {size} bytes, over max_artifact_mb "
                f"({limit_bytes / 1e6:g} MB): the sender should have kept it on the host"
            )
    total = sum(manifest.values())
    free = shutil.disk_usage(dest).free
    if total > free - FREE_MARGIN_BYTES:
        raise CopyRefused(
            f"the model files ({total / 1e6:.0f} MB) do not fit in the {free / 1e6:.0f} MB free "
            f"on this server's disk (keeping {FREE_MARGIN_BYTES >> 20} MiB free); free space "
            "or lower max_artifact_mb"
        )


def extract(fd: int, dest: Path, manifest: Mapping[str, int], on_bytes: Callable[[int], object]) -> None:
    """Reads the tar stream on `fd` to its end into `dest` by the rules above; CopyRefused otherwise.
    on_bytes(n) is called as file bytes land (the progress line and the stall watch)."""
    folders = {str(parent) for name in manifest for parent in PurePosixPath(name).parents if str(parent) != "."}
    landed: set[str] = set()
    meta: dict[str, Any] = {}
    while True:
        header = _read_exact(fd, BLOCK)
        if header is None:
            raise CopyCutShort("the stream ended before the archive's end")
        if header == bytes(BLOCK):
            _drain(fd)
            return
        flag, name, size = _parse_header(header, meta)
        if flag in (b"x", b"g", b"L"):
            meta = _read_meta(fd, flag, size, meta)
            continue
        meta = {}
        if flag in REGULAR:
            _take_file(fd, dest, name, size, manifest, landed, on_bytes)
        elif flag == b"5":
            if name not in folders or size:
                raise CopyRefused(f"{name}/ is a folder no announced file is in")
            _folder(dest, name)
        else:
            raise CopyRefused(
                f"{name} is {KINDS.get(flag, f'an entry of type {flag!r}')} (only regular files and folders are taken)"
            )


def unpack_upload(upload: Path, dest: Path, limit_bytes: int) -> dict[str, Any]:
    """A ray run's model files as its agent sent them (agent/model_files.py: a JSON line with the manifest,
    then the tar) into a new `dest`, by the rules above, every announced file whole; the JSON line's note.
    CopyRefused or CopyCutShort otherwise, with `dest` removed."""
    with open(upload, "rb", buffering=0) as fh:
        fd = fh.fileno()
        line = _first_line(fd)
        try:
            note = json.loads(line) if line is not None else None
        except ValueError:
            note = None
        manifest = manifest_of(note)
        if manifest is None:
            raise CopyRefused("the upload does not begin with a manifest line")
        check_manifest(manifest, limit_bytes, dest.parent)
        os.lseek(fd, len(line or b"") + 1, os.SEEK_SET)
        dest.mkdir(mode=0o700)
        try:
            extract(fd, dest, manifest, lambda _size: None)
            for name in manifest:
                if not (dest / name).is_file():
                    raise CopyCutShort(f"{name} was announced and did not come")
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
    return dict(note or {})


def _first_line(fd: int) -> bytes | None:
    """The line at the file's start, without its newline; None when none ends within MAX_NOTE_BYTES."""
    head = bytearray()
    while len(head) <= MAX_NOTE_BYTES:
        data = os.read(fd, 1 << 16)
        if not data:
            return None
        head += data
        if b"\n" in data:
            line = bytes(head[: head.index(b"\n")])
            return line if len(line) <= MAX_NOTE_BYTES else None
    return None


def _take_file(
    fd: int,
    dest: Path,
    name: str,
    size: int,
    manifest: Mapping[str, int],
    landed: set[str],
    on_bytes: Callable[[int], object],
) -> None:
    if name not in manifest:
        raise CopyRefused(f"{name} was not announced")
    if size != manifest[name]:
        raise CopyRefused(f"{name} holds {size} bytes where {manifest[name]} were announced")
    if name in landed:
        raise CopyRefused(f"{name} comes twice")
    landed.add(name)
    parent = PurePosixPath(name).parent
    if str(parent) != ".":
        _folder(dest, str(parent))
    try:
        out = os.open(dest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise CopyRefused(f"{name} cannot be created: {exc.strerror}") from None
    try:
        _copy(fd, out, size, on_bytes)
    finally:
        os.close(out)
    if _read_exact(fd, -size % BLOCK) is None:
        raise CopyCutShort(f"the stream ended inside {name}")


def _folder(dest: Path, name: str) -> None:
    """Each folder on the way, created here or already a real folder (never a link: none is created)."""
    path = dest
    for part in PurePosixPath(name).parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        if not path.is_dir() or path.is_symlink():
            raise CopyRefused(f"{name}: {part} is a file and a folder")


def _copy(fd: int, out: int, size: int, on_bytes: Callable[[int], object]) -> None:
    left = size
    splice = getattr(os, "splice", None)
    while left:
        want = min(left, COPY_CHUNK_BYTES)
        moved = -1
        if splice is not None:
            try:
                moved = splice(fd, out, want)
            except OSError:  # not a pipe, or a kernel without it for this file system
                splice = None
        if moved < 0:
            data = os.read(fd, want)
            moved = len(data)
            _write_all(out, data)
        if moved == 0:
            raise CopyCutShort(f"the stream ended {left} bytes before the end of a file")
        left -= moved
        on_bytes(moved)


def _write_all(out: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]


def _parse_header(block: bytes, meta: Mapping[str, Any]) -> tuple[bytes, str, int]:
    """(type flag, checked name, size) of one header; the pax or GNU long name before it wins."""
    stored = _field(block[148:156])
    if not stored or stored.strip(b"01234567") or int(stored, 8) != sum(block[:148]) + 256 + sum(block[156:]):
        raise CopyRefused("the stream is not a tar archive (a header's checksum is wrong)")
    flag = block[156:157]
    if flag in (b"x", b"g", b"L"):
        return flag, "", _number(block[124:136])
    raw = _field(block[0:100])
    if block[257:263] == b"ustar\0" and _field(block[345:500]):  # POSIX ustar splits long names
        raw = _field(block[345:500]) + b"/" + raw
    name = meta.get("path", raw)
    try:
        text = name.decode() if isinstance(name, bytes) else name
    except UnicodeDecodeError:
        raise CopyRefused(f"{name[:200]!r} is not a UTF-8 name") from None
    return flag, _safe_name(text, strip=True), meta.get("size", _number(block[124:136]))


def _read_meta(fd: int, flag: bytes, size: int, meta: dict[str, Any]) -> dict[str, Any]:
    if size > MAX_META_BYTES:
        raise CopyRefused(f"a tar header of {size} bytes (more than any name needs)")
    data = _read_exact(fd, size + (-size % BLOCK))
    if data is None:
        raise CopyCutShort("the stream ended inside a header")
    data = data[:size]
    if flag == b"L":
        return {**meta, "path": data.split(b"\0", 1)[0]}
    records = _pax_records(data)
    if flag == b"g":
        if {"path", "size"} & records.keys():
            raise CopyRefused("a global pax header sets names or sizes")
        return meta
    found = dict(meta)
    if "path" in records:
        found["path"] = records["path"]
    if "size" in records:
        if not records["size"].isdigit():
            raise CopyRefused(f"a pax size that is not a number: {records['size'][:40]!r}")
        found["size"] = int(records["size"])
    return found


def _pax_records(data: bytes) -> dict[str, str]:
    """pax's `<length> <key>=<value>\\n` records."""
    records, at = {}, 0
    while at < len(data):
        length_text, space, _ = data[at : at + 20].partition(b" ")
        if not space or not length_text.isdigit() or int(length_text) <= len(length_text) + 1:
            raise CopyRefused("a pax header that is not pax")
        record = data[at + len(length_text) + 1 : at + int(length_text)]
        key, equals, value = record.rstrip(b"\n").partition(b"=")
        if not equals:
            raise CopyRefused("a pax header that is not pax")
        try:
            records[key.decode()] = value.decode()
        except UnicodeDecodeError:
            raise CopyRefused("a pax header that is not UTF-8") from None
        at += int(length_text)
    return records


def _safe_name(name: str, strip: bool = False) -> str:
    """The name relative to artifacts/, or CopyRefused: no absolute path, no `..`, nothing odd."""
    if strip:
        while name.startswith("./"):
            name = name[2:]
        name = name.rstrip("/")
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or len(name.encode(errors="surrogatepass")) > MAX_NAME_BYTES
        or any(part in ("", ".", "..") for part in parts)
        or "\0" in name
    ):
        raise CopyRefused(f"{name[:200]!r} is not a name inside the model folder")
    return name


def _field(raw: bytes) -> bytes:
    return raw.split(b"\0", 1)[0].strip(b" ")


def _number(raw: bytes) -> int:
    """A header's number: octal text, or GNU's base-256 for sizes of 8 GiB and more."""
    if raw[0] & 0x80:
        if raw[0] == 0xFF:
            raise CopyRefused("a negative size in a tar header")
        return int.from_bytes(bytes([raw[0] & 0x7F]) + raw[1:], "big")
    text = _field(raw)
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise CopyRefused(f"a tar header's number is not a number: {text[:20]!r}") from None


def _read_exact(fd: int, size: int) -> bytes | None:
    """Exactly `size` bytes, or None when the stream ends first."""
    parts, left = [], size
    while left:
        data = os.read(fd, left)
        if not data:
            return None
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def _drain(fd: int) -> None:
    """What follows the end: tar's padding to its record size, and nothing more than that."""
    trailing = 0
    while data := os.read(fd, 1 << 16):
        trailing += len(data)
        if trailing > MAX_TRAILER_BYTES:
            raise CopyRefused(f"more than {MAX_TRAILER_BYTES >> 20} MiB follow the archive's end")

"""The receiving side's rules for a host's tar stream (executors/untar.py), on real tar streams.

The streams are written by Python's tarfile in the formats real senders use (GNU, as the system tar
writes by default, and pax, as tarfile does), and by hand where a lying host would bend them. They go
through a real pipe, as ssh's stdout does, so the splice(2) path is the one tested; one case reads a
plain file, the path a kernel without splice takes.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from potato_queue.agent.model_files import pack_model_files
from potato_queue.executors.untar import (
    CopyCutShort,
    CopyRefused,
    check_manifest,
    extract,
    manifest_of,
    unpack_upload,
)

pytestmark = pytest.mark.unit

LONG = "adapter/" + "x" * 120 + "/weights.safetensors"  # past ustar's 100 bytes: a GNU long name or pax path


def archive(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o777  # a host asking for world-writable files gets 0600
    return info, data


def special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def through_pipe(stream: bytes, dest: Path, manifest: dict[str, int], on_bytes: Callable[[int], object] = abs) -> None:
    """extract() reading a real pipe with a writer on the other end, as it reads ssh's stdout."""
    read_fd, write_fd = os.pipe()

    def write() -> None:
        try:
            os.write(write_fd, stream) if len(stream) < 60_000 else _write_all(write_fd, stream)
        except BrokenPipeError:
            pass
        finally:
            os.close(write_fd)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        extract(read_fd, dest, manifest, on_bytes)
    finally:
        os.close(read_fd)
        writer.join(10)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def test_regular_files_and_folders_land_private_with_their_bytes(tmp_path: Path) -> None:
    big = os.urandom(3 << 20)  # several splices
    files = {"./config.json": b"{}", "./" + LONG: big, "./model/vocab.txt": "olá\n".encode()}
    stream = archive([regular(name, data) for name, data in files.items()])
    landed: list[int] = []
    manifest = {name[2:]: len(data) for name, data in files.items()}
    through_pipe(stream, tmp_path, manifest, landed.append)
    assert (tmp_path / LONG).read_bytes() == big and (tmp_path / "config.json").read_bytes() == b"{}"
    assert sum(landed) == sum(manifest.values()), "progress counts every byte"
    assert stat.S_IMODE((tmp_path / "config.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o700


def test_a_pax_stream_with_long_and_unicode_names_lands_too(tmp_path: Path) -> None:
    name = "modèle/" + "y" * 150 + ".bin"
    stream = archive([regular(name, b"abc")], fmt=tarfile.PAX_FORMAT)
    through_pipe(stream, tmp_path, {name: 3})
    assert (tmp_path / name).read_bytes() == b"abc"


def test_a_plain_file_descriptor_works_without_splice(tmp_path: Path) -> None:
    stream_file = tmp_path / "stream.tar"
    stream_file.write_bytes(archive([regular("a.bin", b"x" * 5000)]))
    (tmp_path / "out").mkdir()
    fd = os.open(stream_file, os.O_RDONLY)
    try:
        extract(fd, tmp_path / "out", {"a.bin": 5000}, abs)
    finally:
        os.close(fd)
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"x" * 5000


@pytest.mark.parametrize(
    ("member", "said"),
    [
        (special("config.json", tarfile.SYMTYPE, "/etc/shadow"), "config.json is a symbolic link"),
        (special("rootfs", tarfile.SYMTYPE, "/"), "rootfs is a symbolic link"),
        (special("weights.bin", tarfile.LNKTYPE, "/etc/passwd"), "weights.bin is a hard link"),
        (special("tty", tarfile.CHRTYPE), "tty is a character device"),
        (special("disk", tarfile.BLKTYPE), "disk is a block device"),
        (special("pipe", tarfile.FIFOTYPE), "pipe is a FIFO"),
    ],
)
def test_links_devices_and_fifos_are_refused_and_nothing_is_created(
    tmp_path: Path, member: tuple[tarfile.TarInfo, None], said: str
) -> None:
    stream = archive([regular("ok.txt", b"fine"), member])
    with pytest.raises(CopyRefused) as refused:
        through_pipe(stream, tmp_path, {"ok.txt": 4, member[0].name: 0})
    assert str(refused.value) == f"{said} (only regular files and folders are taken)"
    assert not os.path.lexists(tmp_path / member[0].name)


@pytest.mark.parametrize(
    ("members", "manifest", "said"),
    [
        ([regular("extra.bin", b"1")], {}, "extra.bin was not announced"),
        ([regular("model.bin", b"x" * 2048)], {"model.bin": 1}, "model.bin holds 2048 bytes where 1 were announced"),
        ([regular("a", b"1"), regular("./a", b"1")], {"a": 1}, "a comes twice"),
        ([regular("../escape", b"1")], {"escape": 1}, "'../escape' is not a name inside the model folder"),
        ([regular("/etc/cron.d/x", b"1")], {"x": 1}, "'/etc/cron.d/x' is not a name inside the model folder"),
        ([special("deep", tarfile.DIRTYPE)], {"a": 1}, "deep/ is a folder no announced file is in"),
    ],
)
def test_what_was_not_announced_is_refused(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], manifest: dict[str, int], said: str
) -> None:
    with pytest.raises(CopyRefused, match="^" + said.replace("(", r"\(").replace(".", r"\.") + "$"):
        through_pipe(archive(members), tmp_path, manifest)


def test_a_pax_path_that_climbs_out_is_refused(tmp_path: Path) -> None:
    info, data = regular("innocent.bin", b"1")
    info.pax_headers = {"path": "../../etc/passwd"}
    with pytest.raises(CopyRefused, match="is not a name inside the model folder"):
        through_pipe(archive([(info, data)], fmt=tarfile.PAX_FORMAT), tmp_path, {"innocent.bin": 1})
    assert not (tmp_path.parent.parent / "etc" / "passwd").exists()


def test_a_stream_cut_inside_a_file_is_cut_short_not_a_lie(tmp_path: Path) -> None:
    stream = archive([regular("model.bin", b"z" * 100_000)])
    with pytest.raises(CopyCutShort, match="bytes before the end of a file"):
        through_pipe(stream[:50_000], tmp_path, {"model.bin": 100_000})
    with pytest.raises(CopyCutShort, match="before the archive's end"):
        through_pipe(b"", tmp_path / "nothing", {})


def test_garbage_and_endless_trailers_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CopyRefused, match="not a tar archive"):
        through_pipe(os.urandom(4096), tmp_path, {})
    stream = archive([regular("a", b"1")]) + b"\0" * (2 << 20)
    (tmp_path / "t").mkdir()
    with pytest.raises(CopyRefused, match="MiB follow the archive's end"):
        through_pipe(stream, tmp_path / "t", {"a": 1})


def test_the_manifest_is_checked_before_a_byte_is_written(tmp_path: Path) -> None:
    with pytest.raises(CopyRefused, match=r"^big\.bin is announced with 2000001 bytes, over max_artifact_mb \(2 MB\)"):
        check_manifest({"big.bin": 2_000_001}, 2_000_000, tmp_path)
    with pytest.raises(CopyRefused, match=r"^the model files \(\d+ MB\) do not fit in the \d+ MB free on this server"):
        check_manifest({f"shard-{i}": 10**14 for i in range(20)}, 10**15, tmp_path)
    with pytest.raises(CopyRefused, match="not a name inside the model folder"):
        check_manifest({"../x": 1}, 10, tmp_path)
    check_manifest({"model/a.bin": 10}, 10, tmp_path)


@pytest.mark.parametrize(
    ("note", "manifest"),
    [
        ({"manifest": {"a": 1, "b/c": 0}}, {"a": 1, "b/c": 0}),
        ({"manifest": {"a": "1"}}, None),
        ({"manifest": {"a": -1}}, None),
        ({"manifest": {"a": True}}, None),
        ({"manifest": ["a"]}, None),
        ({"total": 3}, None),
    ],
)
def test_a_manifest_note_is_taken_only_in_its_shape(note: dict[str, object], manifest: dict[str, int] | None) -> None:
    assert manifest_of(note) == manifest


# -- a ray run's upload: agent/model_files.py's pack, unpacked by the same rules -------------------------


def test_an_agents_packed_model_files_unpack_whole_and_the_too_big_are_named(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / LONG).parent.mkdir(parents=True)
    (work / LONG).write_bytes(b"w" * 3000)
    (work / "config.json").write_text("{}")
    (work / "big.bin").write_bytes(b"b" * 5000)
    (work / "predictions.jsonl").write_text("{}\n")  # sent on its own route, never in the model files
    os.symlink("/etc/passwd", work / "link.json")  # a link is never packed
    upload = tmp_path / "model.upload"
    sent, kept = pack_model_files(str(work), str(upload), 4000)
    assert sent == {LONG: 3000, "config.json": 2} and kept == [("big.bin", 5000)]
    assert stat.S_IMODE(upload.stat().st_mode) == 0o600
    note = unpack_upload(upload, tmp_path / "artifacts", 4000)
    assert note["kept"] == {"big.bin": 5000}
    landed = sorted(str(p.relative_to(tmp_path / "artifacts")) for p in (tmp_path / "artifacts").rglob("*"))
    assert landed == sorted(["config.json", "adapter", str(Path(LONG).parent), LONG])
    assert (tmp_path / "artifacts" / LONG).read_bytes() == b"w" * 3000


def _upload(path: Path, line: bytes, stream: bytes) -> Path:
    path.write_bytes(line + stream)
    return path


@pytest.mark.parametrize(
    ("line", "members", "error", "said"),
    [
        (b"not json\n", [regular("a", b"1")], CopyRefused, "does not begin with a manifest line"),
        (b'{"manifest": {"a": 1}}', [], CopyRefused, "does not begin with a manifest line"),  # no newline
        (b'{"manifest": {"a": 1, "b": 1}}\n', [regular("a", b"1")], CopyCutShort, "b was announced and did not come"),
        (b'{"manifest": {"a": 1}}\n', [special("a", tarfile.SYMTYPE, "/etc/passwd")], CopyRefused, "a symbolic link"),
        (b'{"manifest": {"a": 9999}}\n', [regular("a", b"1")], CopyRefused, "over max_artifact_mb"),
    ],
)
def test_an_upload_that_is_not_what_it_announced_is_refused_and_leaves_nothing(
    tmp_path: Path, line: bytes, members: list[tuple[tarfile.TarInfo, bytes | None]], error: type, said: str
) -> None:
    upload = _upload(tmp_path / "model.upload", line, archive(members))
    with pytest.raises(error, match=said):
        unpack_upload(upload, tmp_path / "artifacts", 1000)
    assert not (tmp_path / "artifacts").exists()

"""wire/files.py: the one JSON Lines reader every side uses (bundle splits, predictions, events), and the one JSON file reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from potato_queue.wire.files import JsonLineError, read_json, read_jsonl

pytestmark = pytest.mark.unit


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_blank_lines_are_passed_over_and_numbers_are_the_files(tmp_path: Path) -> None:
    path = _file(tmp_path, '{"a": 1}\n\n   \n[2]\r\nnull\n')
    assert list(read_jsonl(path)) == [(1, {"a": 1}), (4, [2]), (5, None)]


def test_a_bad_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = _file(tmp_path, '{"a": 1}\n{"a": \n')
    with pytest.raises(JsonLineError) as caught:
        list(read_jsonl(path))
    assert caught.value.line == 2 and str(path) in str(caught.value) and "line 2 is not JSON" in str(caught.value)


def test_a_bad_line_skipped_or_given_as_none(tmp_path: Path) -> None:
    path = _file(tmp_path, 'oops\n{"b": 2}\n')
    assert list(read_jsonl(path, not_json="skip")) == [(2, {"b": 2})]
    assert list(read_jsonl(path, not_json="none")) == [(1, None), (2, {"b": 2})]


def test_a_missing_file(tmp_path: Path) -> None:
    assert list(read_jsonl(tmp_path / "absent.jsonl", missing_ok=True)) == []
    with pytest.raises(FileNotFoundError):
        list(read_jsonl(tmp_path / "absent.jsonl"))


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"t": "\xff"}\n')
    with pytest.raises(UnicodeDecodeError):
        list(read_jsonl(path))
    assert list(read_jsonl(path, errors="replace")) == [(1, {"t": "\ufffd"})]


def test_read_json_says_what_the_file_is_in_the_callers_own_error(tmp_path: Path) -> None:
    class Mine(ValueError):
        pass

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"a": 1}')
    bad.write_text("{a")
    assert read_json(good, "the test file", Mine) == {"a": 1}
    with pytest.raises(Mine, match=r"^The test file is not valid JSON: "):
        read_json(bad, "the test file", Mine)
    with pytest.raises(Mine, match=r"^Could not read the test file: \[Errno 2\]"):
        read_json(tmp_path / "missing.json", "the test file", Mine)

"""wire/files.py: the one JSON Lines reader every side uses (bundle splits, predictions, events)."""

from __future__ import annotations

from pathlib import Path

import pytest

from potato_queue.wire.files import JsonLineError, read_jsonl

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

"""A project's items, read as Potato 2.12's server reads its data files (`flask_server.load_instance_data`).

The format is the file's extension (`csv`, `tsv`, `json`, `jsonl`, `parquet`; anything else Potato refuses),
an entry may be `{path, encoding}` (default UTF-8, a byte order mark dropped), and every id is a string:

- json: the whole file as one array (or one object), else JSON Lines where a line holding an array gives
  each of its elements; jsonl: one object a line. A line that is not JSON is refused, naming it.
- csv / tsv: every cell verbatim as a string (Potato's `data_sources/parsing.py`: nothing guessed as a
  number, `007` stays `007`); CSV quotes as RFC 4180, TSV has no quoting; a short row is padded with "",
  a row with more cells than the header is refused.
- parquet: pyarrow's table as pandas records, the id and text columns as strings.

Potato refuses an item without the id field, an empty id and an id used twice (across every data file), so
this does too, in our words with the fix: a project Potato would not start never trains on guessed ids.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potato_queue.errors import PotatoQueueError

__all__ = ["FORMATS", "DataFile", "DataFileError", "data_files", "file_items", "UncleanDecoder"]

#: What Potato reads, by extension.
FORMATS = ("csv", "tsv", "json", "jsonl", "parquet")
_FIELDS_SHOWN = 8  # of an item that lacks the id field: the fields it has, so the right key is a glance away
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a lone surrogate's escape: not writable as UTF-8


class DataFileError(PotatoQueueError):
    """A data file Potato would refuse (or cannot be read): what and where, and the fix."""


@dataclass(frozen=True)
class DataFile:
    """One `data_files` entry: its path (relative to task_dir, as written), where it is, its encoding."""

    written: str
    path: Path
    encoding: str = "utf-8"

    @property
    def format(self) -> str:
        """Potato's rule: whatever follows the last dot of the path as written."""
        return self.written.split(".")[-1]


def data_files(raw: Any, task_path: Path) -> list[DataFile]:
    """The entries of `data_files` (a path, a list of paths, `{path, encoding}` entries)."""
    entries = raw if isinstance(raw, list) else [raw]
    found = []
    for entry in entries:
        written, encoding = (entry.get("path"), entry.get("encoding")) if isinstance(entry, dict) else (entry, None)
        if isinstance(written, str) and written:
            found.append(DataFile(written, task_path / Path(written).expanduser(), str(encoding or "utf-8")))
    return found


class UncleanDecoder(json.JSONDecoder):
    """json's own decoder that notes a non-finite number (NaN, Infinity, or a number too large for a float)
    or, in the file it read, a lone surrogate's escape: what makes an item unwritable as strict JSON or
    UTF-8."""

    def __init__(self) -> None:
        self.unclean = False
        super().__init__(parse_float=self._float, parse_constant=self._constant)

    def _float(self, text: str) -> float:
        value = float(text)
        self.unclean = self.unclean or not math.isfinite(value)
        return value

    def _constant(self, text: str) -> float:
        self.unclean = True
        return float(text)


def _text(data_file: DataFile) -> str:
    encoding = data_file.encoding
    if encoding.lower().replace("_", "-") in ("utf-8", "utf8"):
        encoding = "utf-8-sig"  # Potato drops a byte order mark
    try:
        with open(data_file.path, encoding=encoding, newline="") as fh:
            text = fh.read()
    except LookupError:
        raise DataFileError(
            f"data file {data_file.path} names the encoding {data_file.encoding!r}, which Python does not know",
            fix="name a Python codec in its data_files entry (utf-8, latin-1, cp1252, utf-16, ...)",
        ) from None
    except UnicodeDecodeError as exc:
        raise _not_text(data_file, exc) from None
    except OSError as exc:
        raise DataFileError(
            f"data file {data_file.path} cannot be read: {exc.strerror or exc}",
            fix="make it readable by the account potato-queue runs as",
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def _not_text(data_file: DataFile, exc: UnicodeDecodeError) -> DataFileError:
    return DataFileError(
        f"data file {data_file.path} is not {data_file.encoding} text: {exc.reason} at byte {exc.start}",
        fix=f"name its encoding: data_files: [{{path: {data_file.written}, encoding: latin-1}}] "
        "(or the codec it was saved in), or save it as UTF-8",
    )


def _json_records(data_file: DataFile, decoder: UncleanDecoder) -> list[Any]:
    """Potato's two JSON readers: .json (array, object, else lines with arrays spread) and .jsonl."""
    text = _text(data_file)
    decoder.unclean = decoder.unclean or bool(_SURROGATE_ESCAPE.search(text))
    if data_file.format == "json":
        try:
            whole = decoder.decode(text)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, list):
            return whole
        if isinstance(whole, dict):
            return [whole]
    records: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            value = decoder.decode(line)
        except json.JSONDecodeError as exc:
            raise DataFileError(
                f"data file {data_file.path}: line {number} is not JSON ({exc.msg}, column {exc.colno}), and "
                f"Potato refuses the whole file",
                fix="correct or remove that line (a .jsonl file holds one JSON object a line)",
            ) from None
        spread = data_file.format == "json" and isinstance(value, list)
        records.extend(value) if spread else records.append(value)
    return records


def _delimited_records(data_file: DataFile) -> Iterator[dict[str, str]]:
    """Potato's CSV / TSV rows: verbatim strings keyed by the header."""
    import io

    text = _text(data_file)
    if data_file.format == "tsv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=",")
    try:
        yield from _rows_of(data_file, reader)
    except csv.Error as exc:
        raise _csv_error(data_file, reader.line_num, exc) from None


def _rows_of(data_file: DataFile, reader: Any) -> Iterator[dict[str, str]]:
    """The rows after the header, keyed by it; short rows padded, blank ones skipped, long ones refused."""
    header = next(reader, None)
    if header is None:
        return
    width = len(header)
    for row in reader:
        if len(row) == width and (width > 1 or row != [""]):  # nearly every row: nothing to pad or skip
            yield dict(zip(header, row, strict=True))
            continue
        if not row or row == [""]:
            continue
        if len(row) > width:
            raise DataFileError(
                f"data file {data_file.path}: the row at line {reader.line_num} has {len(row)} cells and the "
                f"header has {width}, and Potato refuses the whole file",
                fix='quote a cell that holds the separator ("a, b"), or remove the extra cells',
            )
        yield dict(zip(header, row + [""] * (width - len(row)), strict=True))


def _csv_error(data_file: DataFile, line: int, exc: csv.Error) -> DataFileError:
    return DataFileError(
        f"data file {data_file.path} cannot be read as {data_file.format.upper()} at line {line}: {exc}",
        fix="correct that line (a cell that starts with a quote must end with one)",
    )


def _parquet_records(data_file: DataFile, id_key: str, text_key: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataFileError(
            f"data file {data_file.path} is Parquet, and reading it needs pyarrow, which is not installed here",
            fix="pip install 'potato-queue[parquet]' (pyarrow) where the server runs",
        ) from None
    try:
        frame = pq.read_table(data_file.path).to_pandas()
    except Exception as exc:  # noqa: BLE001 - pyarrow's many errors all mean one thing here
        raise DataFileError(
            f"data file {data_file.path} cannot be read as Parquet: {type(exc).__name__}: {exc}",
            fix="write it again with pandas' to_parquet or pyarrow, or give the items as JSON Lines",
        ) from None
    if id_key not in frame.columns:
        raise _no_id(data_file, 1, list(frame.columns), id_key)
    frame[id_key] = frame[id_key].astype(str)
    if text_key in frame.columns:
        frame = frame.astype({text_key: str})
    records: list[dict[str, Any]] = frame.to_dict("records")
    return records


def _no_id(data_file: DataFile, number: int, fields: list[str], id_key: str) -> DataFileError:
    shown = ", ".join(map(str, fields[:_FIELDS_SHOWN])) + (" ..." if len(fields) > _FIELDS_SHOWN else "")
    return DataFileError(
        f"data file {data_file.path}: item {number} has no field '{id_key}' (item_properties.id_key); its "
        f"fields are {shown or 'none'}, and Potato refuses an item without its id",
        fix="set item_properties.id_key to the field that holds each item's id"
        + (f" (one of {shown})" if shown else "")
        + ", or add that field to every item",
    )


def file_items(
    data_file: DataFile, id_key: str, text_key: str, decoder: UncleanDecoder
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, item) of one data file, in file order, refused as Potato refuses it (DataFileError)."""
    fmt = data_file.format
    if fmt not in FORMATS:
        raise DataFileError(
            f"data file {data_file.path} is a '.{fmt}' file by its name, and Potato reads only "
            f"{', '.join('.' + f for f in FORMATS)} data files",
            fix="convert it to one of those (JSON Lines is the simplest), or rename it if it is one",
        )
    if not data_file.path.is_file():
        raise DataFileError(
            f"data file {data_file.path} does not exist, so the bundle would miss its items",
            fix="restore the file or correct data_files in the config",
        )
    records: Any
    if fmt in ("csv", "tsv"):
        records = _delimited_records(data_file)
    elif fmt == "parquet":
        records = _parquet_records(data_file, id_key, text_key)
        decoder.unclean = True  # its floats may be NaN, which no JSON carries: the bundle cleans its items
    else:
        records = _json_records(data_file, decoder)
    for number, item in enumerate(records, 1):
        if not isinstance(item, dict):
            raise DataFileError(
                f"data file {data_file.path}: item {number} is {type(item).__name__}, not an object of fields",
                fix='write each item as one JSON object, such as {"id": "1", "text": "..."}',
            )
        if id_key not in item:
            raise _no_id(data_file, number, list(item), id_key)
        iid = item[id_key]
        if iid is None or str(iid).strip() == "":
            raise DataFileError(
                f"data file {data_file.path}: item {number}'s '{id_key}' is empty, and Potato refuses an item "
                "without its id",
                fix="give every item an id",
            )
        yield str(iid), item

"""Where trace rows come from (a local file, a Hugging Face dataset) and how their fields are read.

Every format reader iterates a :class:`RowSource` and reads fields through :class:`Row`, whose
errors name the source (file path or dataset), the row (1-based line or record number) and the
field, so a malformed row is reported the same way whatever the source.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message names the file, row and field."""

    def __init__(self, path: Union[str, Path], problem: str, row: Optional[int] = None,
                 field: Optional[str] = None) -> None:
        where = str(path)
        if row is not None:
            where += f": row {row}"
        if field is not None:
            where += f": field {field!r}"
        super().__init__(f"{where}: {problem}")
        self.path, self.row, self.field = str(path), row, field


class Row:
    """One row of a source, for reading fields with errors that say where they are.

    ``columns`` maps a format's field names to the source's column names (a dataset whose
    columns are named otherwise): the row is read under the format's names, and an error names
    both (``field 'input_length' (column 'prompt_len')``)."""

    def __init__(self, path: Union[str, Path], number: int, data: Any,
                 columns: Optional[Mapping[str, str]] = None) -> None:
        self.path, self.row_number, self.columns = path, number, columns or {}
        if not isinstance(data, dict):
            raise self.error(None, f"expected an object, got {type(data).__name__}")
        if self.columns:
            data = {**data, **{name: data.get(column) for name, column in self.columns.items()}}
        self.data = data

    def error(self, field: Optional[str], problem: str) -> TraceFormatError:
        if field is not None:
            root = re.match(r"[A-Za-z_][A-Za-z0-9_]*", field)
            column = self.columns.get(root.group(0)) if root else None
            if column is not None and column != root.group(0):
                field = f"{field} (column {column!r})"
        return TraceFormatError(self.path, problem, self.row_number, field)

    def checked(self, field: str, make: Callable[[], Any]) -> Any:
        """``make()``, a ValueError it raises (a session or tree that does not hold together) named
        at ``field`` of this row."""
        try:
            return make()
        except TraceFormatError:
            raise
        except ValueError as exc:
            raise self.error(field, str(exc)) from None

    def require(self, obj: dict, key: str, field: str) -> Any:
        value = obj.get(key)
        if value is None:
            raise self.error(field, "missing")
        return value

    def integer(self, value: Any, field: str, minimum: int = 0) -> int:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value) or value != int(value) or value < minimum:
            raise self.error(field, f"expected an integer >= {minimum}, got {value!r}")
        return int(value)

    def number(self, value: Any, field: str, minimum: Optional[float] = None) -> float:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value) or (minimum is not None and value < minimum):
            bound = "" if minimum is None else f" >= {minimum:g}"
            raise self.error(field, f"expected a number{bound}, got {value!r}")
        return float(value)

    def listing(self, value: Any, field: str) -> list:
        if not isinstance(value, list):
            raise self.error(field, f"expected a list, got {type(value).__name__}")
        return value

    def mapping(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.error(field, f"expected an object, got {type(value).__name__}")
        return value

    def text(self, value: Any, field: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.error(field, f"expected a string, got {value!r}")
        return str(value)

    def timestamp_s(self, value: Any, field: str) -> float:
        """An ISO-8601 time (naive means UTC), a datetime (a dataset's timestamp column) or a
        number of seconds, as seconds."""
        if isinstance(value, datetime):
            return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
        if isinstance(value, str):
            seconds = _parse_iso_s(value)
            if seconds is None:
                raise self.error(field, f"expected an ISO-8601 time, got {value!r}")
            return seconds
        return self.number(value, field)


_ISO_FRACTION = re.compile(r"(\.\d+)")


def gap_between(explicit_s: Optional[float], before_ts: Optional[float],
                after_ts: Optional[float]) -> tuple[Optional[float], bool]:
    """The gap before a call: its recorded gap, else the (non-negative) difference of start
    timestamps, which includes the model's latency, else None. The flag says timestamps were used."""
    if explicit_s is not None:
        return explicit_s, False
    if before_ts is not None and after_ts is not None:
        return max(after_ts - before_ts, 0.0), True
    return None, False


def _parse_iso_s(text: str) -> Optional[float]:
    # Python 3.10's fromisoformat takes neither "Z" nor 7-digit (.NET) fractions; normalise both.
    text = text.strip().replace("Z", "+00:00").replace("z", "+00:00")
    text = _ISO_FRACTION.sub(lambda m: m.group(1)[:7].ljust(7, "0"), text, count=1)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


class RowSource:
    """The rows of one source, numbered from 1; ``name`` is what errors call it."""

    name: str

    def __iter__(self) -> Iterator[Row]:
        raise NotImplementedError


class FileRows(RowSource):
    """A JSONL, gzip JSONL (``.gz``) or Parquet (``.parquet``, read in record batches) file."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self.name = str(path)

    def __iter__(self) -> Iterator[Row]:
        path = self.path
        if not path.is_file():
            raise TraceFormatError(path, "no such file")
        if path.suffix == ".parquet":
            yield from _parquet_rows(path)
            return
        opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as lines:
                for number, line in enumerate(lines, start=1):
                    if not line.strip():
                        continue
                    try:
                        data = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise TraceFormatError(path, f"not valid JSON ({exc.msg} at column {exc.colno})",
                                               number) from None
                    yield Row(path, number, data)
        except (OSError, UnicodeDecodeError, EOFError) as exc:
            raise TraceFormatError(path, f"cannot read as {'gzip ' if opener is gzip.open else ''}JSONL ({exc})") from None


class JsonDocumentRows(FileRows):
    """A file (or ``.gz``) holding one JSON document, an object (row 1) or a list of objects (row =
    the element's number), as some formats ship one trace a file; or else JSONL, one row a line."""

    def __iter__(self) -> Iterator[Row]:
        path = self.path
        if not path.is_file():
            raise TraceFormatError(path, "no such file")
        opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as stream:
                text = stream.read()
        except (OSError, UnicodeDecodeError, EOFError) as exc:
            raise TraceFormatError(path, f"cannot read ({exc})") from None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # not JSONL either: say where the document breaks
                raise TraceFormatError(path, f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                                       exc.lineno) from None
            yield from super().__iter__()
            return
        for number, data in enumerate(document if isinstance(document, list) else [document], start=1):
            yield Row(path, number, data)


def _parquet_rows(path: Path) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches()
        number = 0
        for batch in batches:
            for data in batch.to_pylist():
                number += 1
                yield Row(path, number, data)
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(path, f"cannot read as Parquet ({exc})") from None


@dataclass(frozen=True)
class LoaderOptions:
    """What some formats need beyond the rows (hashable: loaded traces are cached by it).

    ``tokenizer``: a ``tokenizer.json`` file or a directory holding one, to count the tokens of
    formats that carry text (AIPerf's ``text``/``texts`` turns); ``default_output_tokens``: the
    output length of a turn that records none (AIPerf's ``--osl``); ``block_tokens``: the tokens
    a ``hash_ids`` entry stands for (Mooncake's traces use 512)."""

    tokenizer: Optional[str] = None
    default_output_tokens: Optional[int] = None
    block_tokens: int = 512

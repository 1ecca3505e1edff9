"""loadgen/core/recording.py: a flush's columns are the recorded values, whichever way they are copied."""

from __future__ import annotations

import io
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.core import recording
from loadgen.core.recording import _Columns, _typed_column

SCHEMA = pa.schema([("x", pa.float64()), ("n", pa.int64()), ("k", pa.int32()), ("b", pa.bool_()),
                    ("s", pa.string())])

ROWS = {
    "exact": [(0.5, 3, -7, True, "a"), (math.nan, 2 ** 62, 2 ** 31 - 1, False, None), (-0.0, -1, 0, True, "é")],
    # values a typed copy must not take as they are: an int in a float column, None
    "mixed": [(1, 7, None, None, "a"), (2.5, 4, 5, False, "b"), (None, 9, 1, True, "c")],
    "one row": [(1e300, -(2 ** 63), -(2 ** 31), False, "")],
}


def _parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def _take(rows: list, compiled: bool, monkeypatch) -> object:
    monkeypatch.setattr(recording, "_COMPILED", compiled)
    columns = _Columns(SCHEMA)
    for row in rows:
        columns.append(row)
    try:
        return columns.take()
    except Exception as exc:  # noqa: BLE001 - both ways must raise alike
        return type(exc)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_typed_and_list_copies_give_the_same_table(name, monkeypatch):
    typed = _take(ROWS[name], True, monkeypatch)
    listed = _take(ROWS[name], False, monkeypatch)
    assert isinstance(typed, pa.Table) and _parquet_bytes(typed) == _parquet_bytes(listed)
    assert typed.to_pylist()[-1] == dict(zip(SCHEMA.names, ROWS[name][-1]))


@pytest.mark.parametrize("row", [(1.0, 2 ** 63, 1, True, "a"), (1.0, 1, 2 ** 31, True, "a"),
                                 (1.0, True, 1, True, "a"), (1.0, 2.0, 1, True, "a"), (1.0, 1, 1, 1, "a")])
def test_values_a_typed_copy_refuses_give_what_the_list_copy_gives(row, monkeypatch):
    rows = [row, (0.0, 0, 0, False, "b")]
    typed, listed = _take(rows, True, monkeypatch), _take(rows, False, monkeypatch)
    if isinstance(listed, pa.Table):
        assert isinstance(typed, pa.Table) and _parquet_bytes(typed) == _parquet_bytes(listed)
    else:
        assert typed is listed


def test_typed_column_copies_exact_values_and_refuses_others():
    rows = [(0.25, 2 ** 63 - 1, True), (-1e-300, -5, False)]
    floats = _typed_column(rows, 0, recording._FLOAT)
    assert floats.dtype == np.float64 and floats.tolist() == [0.25, -1e-300]
    ints = _typed_column(rows, 1, recording._INT)
    assert ints.dtype == np.int64 and ints.tolist() == [2 ** 63 - 1, -5]
    bools = _typed_column(rows, 2, recording._BOOL)
    assert bools.dtype == np.bool_ and bools.tolist() == [True, False]
    assert _typed_column([(1,)], 0, recording._FLOAT) is None
    assert _typed_column([(True,)], 0, recording._INT) is None
    assert _typed_column([(2 ** 63,)], 0, recording._INT) is None
    assert _typed_column([(1,)], 0, recording._BOOL) is None
    assert _typed_column([(None,)], 0, recording._FLOAT) is None

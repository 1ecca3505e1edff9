"""Arrow arrays from Python values, and NumPy arrays from Arrow columns, through their buffers.

pyarrow imports pandas (a third of a second or more, once per process) the first time it
converts a Python sequence or turns an array into NumPy: its pandas shim first asks whether the
object is a pandas one. A simulated run records its tables and the report reads them back with
no use for pandas, and every run worker, the report's process and each figure worker would pay
that import. These functions build the same arrays from NumPy buffers and read them back the
same way; whatever they do not cover exactly (a value of an unexpected type, an integer out of
range) goes through pyarrow's own conversion, which gives the answer or the error it always did.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["array", "bool_values", "float_values", "int_values", "succeeded"]

_NUMERIC = {pa.float64(): np.float64, pa.int64(): np.int64, pa.int32(): np.int32}
# the NumPy kinds a column of each type takes without converting anything pyarrow would refuse
_KINDS = {pa.float64(): "fi", pa.int64(): "i", pa.int32(): "i", pa.bool_(): "b"}


def array(values: list | np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """``pa.array(values, type=arrow_type)``: None is null, NaN stays a float."""
    try:
        built = _from_buffers(values, arrow_type)
    except (AttributeError, TypeError, ValueError, OverflowError, UnicodeError):
        built = None
    return pa.array(values, type=arrow_type) if built is None else built


def _from_buffers(values: list | np.ndarray, arrow_type: pa.DataType):
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            return None
        values = values.tolist() if values.dtype.kind in "OUS" else values
    n = len(values)
    if arrow_type in _NUMERIC and isinstance(values, list) and n:
        # a None makes an object array: any other holds no null, so it is decided here, without
        # scanning for nulls or converting the list again (most columns)
        dense = np.asarray(values)
        if dense.dtype.kind != "O":
            if dense.ndim != 1 or dense.dtype.kind not in _KINDS[arrow_type]:
                return None
            return _numeric(dense, arrow_type, n, [], None)
    if arrow_type == pa.string() and isinstance(values, list) and n:
        # a run's recorded string columns are mostly one value throughout (run id, arm) or all
        # null (no errors): built whole, without a pass over the values in Python
        first = values[0]
        if values.count(first) == n:
            if first is None:
                return pa.nulls(n, pa.string())
            if type(first) is str:
                encoded = first.encode()
                offsets = np.arange(n + 1, dtype=np.int64) * len(encoded)
                if len(encoded) * n < 2 ** 31:
                    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                                  pa.py_buffer(encoded * n)])
    nulls = [i for i, v in enumerate(values) if v is None] if isinstance(values, list) and None in values else []
    present = [v for v in values if v is not None] if nulls else values
    validity = None
    if nulls:
        valid = np.ones(n, dtype=bool)
        valid[nulls] = False
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if arrow_type == pa.string():
        if any(type(s) is not str for s in present):
            return None
        encoded = [s.encode() for s in present]
        lengths = np.zeros(n, dtype=np.int64)
        lengths[_positions(n, nulls)] = [len(b) for b in encoded]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] >= 2 ** 31:
            return None
        return pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                      pa.py_buffer(b"".join(encoded))], null_count=len(nulls))
    kinds = _KINDS.get(arrow_type)
    if kinds is None:
        return None
    dense = np.asarray(present)
    if dense.ndim != 1 or len(dense) != len(present) or (len(present) and dense.dtype.kind not in kinds):
        return None
    if arrow_type == pa.bool_():
        full = np.zeros(n, dtype=bool)
        full[_positions(n, nulls)] = dense
        data = np.packbits(full, bitorder="little")
        return pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(data)], null_count=len(nulls))
    return _numeric(dense, arrow_type, n, nulls, validity)


def _numeric(dense: np.ndarray, arrow_type: pa.DataType, n: int, nulls: list, validity):
    """A numeric column from the NumPy array of its present values (``nulls``: where the rest are)."""
    dtype = _NUMERIC[arrow_type]
    if dense.dtype.kind == "i" and len(dense) and not (dense.dtype == np.int64 and dtype is np.int64):
        info = np.iinfo(dtype) if dtype is not np.float64 else None
        if info is not None and (dense.min() < info.min or dense.max() > info.max):
            return None
        if info is None and np.abs(dense).max() > 2 ** 53:  # pyarrow refuses ints a float64 cannot hold
            return None
    if nulls:
        data = np.zeros(n, dtype=dtype)
        data[_positions(n, nulls)] = dense
    else:
        data = dense.astype(dtype, copy=False)
    return pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(data)], null_count=len(nulls))


def _positions(n: int, nulls: list) -> np.ndarray | slice:
    if not nulls:
        return slice(None)
    keep = np.ones(n, dtype=bool)
    keep[nulls] = False
    return keep


def _chunks(column: pa.Array | pa.ChunkedArray) -> list:
    return column.chunks if isinstance(column, pa.ChunkedArray) else [column]


_FLOAT64, _INT64 = pa.float64(), pa.int64()


def _as(chunk: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """``chunk.cast(arrow_type)``, without the cast's call when the chunk is of that type already
    (most are: a recorded table's columns come in one chunk per flush)."""
    return chunk if chunk.type == arrow_type else chunk.cast(arrow_type)


_INTEGERS = {pa.int64(): np.int64, pa.int32(): np.int32}
_EXACT_IN_FLOAT64 = 2 ** 53  # pyarrow's safe cast refuses an integer float64 cannot hold exactly


def _float64(chunk: pa.Array) -> np.ndarray:
    """The chunk's values as float64 (null slots hold anything): an integer chunk converted in
    NumPy, as pyarrow's cast would (its cast imports pyarrow.compute, ~20 ms in every run worker)."""
    integer = _INTEGERS.get(chunk.type)
    if integer is not None:
        values = _primitive(chunk, integer)
        if not len(values) or (values.max() <= _EXACT_IN_FLOAT64 and values.min() >= -_EXACT_IN_FLOAT64):
            return values.astype(np.float64)
    return _primitive(_as(chunk, _FLOAT64), np.float64).copy()


def _primitive(chunk: pa.Array, dtype) -> np.ndarray:
    data = chunk.buffers()[1]
    if data is None or len(chunk) == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(chunk), offset=chunk.offset * np.dtype(dtype).itemsize)


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    unpacked = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")
    return unpacked[offset:offset + length].astype(bool)


def _joined(parts: list, dtype) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def float_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The column as float64, nulls as NaN (``column.cast(float64).to_numpy()``)."""
    parts = []
    for chunk in _chunks(column):
        values = _float64(chunk)
        if chunk.null_count:
            values[~_bits(chunk.buffers()[0], chunk.offset, len(chunk))] = np.nan
        parts.append(values)
    return _joined(parts, np.float64)


def int_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An integer column without nulls as int64 (a null is a ValueError)."""
    parts = []
    for chunk in _chunks(column):
        if chunk.null_count:
            raise ValueError(f"an integer column holds {chunk.null_count} nulls")
        parts.append(_primitive(chunk, np.int32).astype(np.int64) if chunk.type == pa.int32()
                     else _primitive(_as(chunk, _INT64), np.int64).copy())
    return _joined(parts, np.int64)


def bool_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean column without nulls as bool (a null is a ValueError)."""
    parts = []
    for chunk in _chunks(column):
        if chunk.null_count:
            raise ValueError(f"a boolean column holds {chunk.null_count} nulls")
        parts.append(_bits(chunk.buffers()[1], chunk.offset, len(chunk)) if len(chunk) else np.zeros(0, dtype=bool))
    return _joined(parts, bool)


def succeeded(errors: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True where an error column is null or empty, read from its validity bits and offsets
    (pyarrow's comparison with a Python "" would import pandas for the scalar, and pyarrow.compute
    costs every run worker ~20 ms to import)."""
    parts = []
    for chunk in _chunks(errors):
        n = len(chunk)
        if chunk.null_count == n:
            parts.append(np.ones(n, dtype=bool))
            continue
        offsets_dtype = _STRING_OFFSETS.get(chunk.type)
        if offsets_dtype is None:  # another type: pyarrow's own kernels
            import pyarrow.compute as pc

            empty = pc.invert(pc.cast(pc.binary_length(chunk), pa.bool_()))
            parts.append(bool_values(pc.or_kleene(pc.is_null(chunk), empty)))
            continue
        validity, offsets = chunk.buffers()[:2]
        bounds = np.frombuffer(offsets, dtype=offsets_dtype, count=chunk.offset + n + 1)[chunk.offset:]
        empty = bounds[1:] == bounds[:-1]
        parts.append(empty | ~_bits(validity, chunk.offset, n) if chunk.null_count else empty)
    return _joined(parts, bool)


_STRING_OFFSETS = {pa.string(): np.int32, pa.binary(): np.int32, pa.large_string(): np.int64,
                   pa.large_binary(): np.int64}

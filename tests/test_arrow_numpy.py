"""loadgen/core/arrow_numpy.py: the same arrays and Parquet bytes as pyarrow's own conversions, and
a simulated run and its report that never import pandas."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.core.arrow_numpy import _from_buffers, array, bool_values, float_values, int_values, succeeded

ROOT = Path(__file__).resolve().parent.parent

COVERED = [
    (pa.float64(), [1.0, None, math.nan, 2, -0.0, 1e300]),
    (pa.float64(), []),
    (pa.float64(), [None, None]),
    (pa.float64(), np.array([0.5, math.nan, 3.0])),
    (pa.int64(), [1, 2, None, -5, 2 ** 62]),
    (pa.int64(), np.arange(5)),
    (pa.int32(), [1, None, -(2 ** 31), 2 ** 31 - 1]),
    (pa.bool_(), [True, None, False] * 7),
    (pa.bool_(), []),
    (pa.string(), ["a", None, "é€ 🙂", ""]),
    (pa.string(), [None]),
    (pa.string(), np.array(["x", "yz"])),
    # one value throughout, or all null: built whole (a run's run_id, arm, error columns)
    (pa.string(), ["run-7"] * 5),
    (pa.string(), ["é€"] * 3),
    (pa.string(), [""] * 4),
    (pa.string(), [None] * 6),
    (pa.int64(), np.array([2 ** 63 - 1, -(2 ** 63)], dtype=np.int64)),
]

# values pyarrow converts its own way or refuses: they must give exactly what pa.array gives
ODD = [
    (pa.int64(), [2 ** 63]), (pa.int32(), [2 ** 31]), (pa.int64(), [1.5]), (pa.float64(), ["1.5"]),
    (pa.bool_(), [1]), (pa.string(), [1]), (pa.string(), [b"x"]), (pa.int64(), [True]),
    (pa.float64(), [2 ** 60 + 1]), (pa.float64(), np.array([1.0, 2.0]).reshape(2, 1)),
]


def _parquet_bytes(column: pa.Array) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"x": column}), buffer)
    return buffer.getvalue()


def _converted(values, arrow_type):
    try:
        return array(values, arrow_type)
    except Exception as exc:  # noqa: BLE001 - compared with what pyarrow raises
        return type(exc)


def _reference(values, arrow_type):
    try:
        return pa.array(values, type=arrow_type)
    except Exception as exc:  # noqa: BLE001
        return type(exc)


@pytest.mark.parametrize("arrow_type,values", COVERED, ids=[f"{t}-{i}" for i, (t, _) in enumerate(COVERED)])
def test_covered_values_take_the_buffer_path_and_write_the_same_parquet(arrow_type, values):
    assert _from_buffers(values, arrow_type) is not None
    built, reference = array(values, arrow_type), pa.array(values, type=arrow_type)
    assert built.type == reference.type and built.null_count == reference.null_count
    assert built.to_pylist() == reference.to_pylist() or _parquet_bytes(built) == _parquet_bytes(reference)
    assert _parquet_bytes(built) == _parquet_bytes(reference)


@pytest.mark.parametrize("arrow_type,values", ODD, ids=[f"{t}-{i}" for i, (t, _) in enumerate(ODD)])
def test_values_it_does_not_cover_get_what_pyarrow_gives(arrow_type, values):
    built, reference = _converted(values, arrow_type), _reference(values, arrow_type)
    if isinstance(reference, pa.Array):
        assert isinstance(built, pa.Array) and _parquet_bytes(built) == _parquet_bytes(reference)
    else:
        assert built is reference


def _chunked_with_nulls() -> pa.ChunkedArray:
    # a sliced chunk (offset 3 into its buffers) and a chunk with nulls
    first = pa.array([9.0, 9.0, 9.0, 1.5, None, 3.0, 4.0])[3:]
    return pa.chunked_array([first, pa.array([None, 6.0, 7.0])])


def test_float_values_match_to_numpy_on_sliced_chunks_with_nulls():
    column = _chunked_with_nulls()
    np.testing.assert_array_equal(float_values(column), column.to_numpy())
    ints = pa.chunked_array([pa.array([5, 6, 7, 8], type=pa.int32())[1:], pa.array([None, 2], type=pa.int32())])
    np.testing.assert_array_equal(float_values(ints), [6.0, 7.0, 8.0, math.nan, 2.0])
    assert float_values(pa.chunked_array([], type=pa.float64())).shape == (0,)


def test_float_values_of_integers_are_pyarrows_cast_without_pyarrow_compute():
    """Integer chunks convert in NumPy (a run worker need not import pyarrow.compute), as the cast
    would: sliced, with nulls, int32 too; one float64 cannot hold exactly is refused as the cast does."""
    for arrow_type in (pa.int64(), pa.int32()):
        whole = pa.array([5, None, -3, 2 ** 31 - 1, 0, None, 7], type=arrow_type)
        for chunk in (whole, whole[1:], whole[2:5]):
            expected = chunk.cast(pa.float64()).to_numpy(zero_copy_only=False)
            np.testing.assert_array_equal(float_values(chunk), expected)
    with pytest.raises(pa.ArrowInvalid):
        float_values(pa.array([2 ** 53 + 1], type=pa.int64()))
    # arrays built by array(): pyarrow's own conversion of Python values imports pandas, and pandas
    # pyarrow.compute
    script = ("import sys, pyarrow as pa\n"
              "from loadgen.core.arrow_numpy import array, float_values, int_values, succeeded\n"
              "float_values(array([1, None, 3], pa.int64())); int_values(array([1, 2], pa.int32()))\n"
              "succeeded(array(['', None, 'x'], pa.string()))\n"
              "print('pandas' in sys.modules, 'pyarrow.compute' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True).stdout.strip() == "False False"


def test_int_and_bool_values_read_sliced_chunks_and_refuse_nulls():
    ints = pa.chunked_array([pa.array([1, 2, 3, 4])[2:], pa.array([-7], type=pa.int64())])
    assert int_values(ints).tolist() == [3, 4, -7] and int_values(ints).dtype == np.int64
    flags = pa.chunked_array([pa.array([True, False, True, True, False, False, True, False, True])[5:],
                              pa.array([True])])
    assert bool_values(flags).tolist() == [False, True, False, True, True]
    with pytest.raises(ValueError, match="nulls"):
        int_values(pa.array([1, None]))
    with pytest.raises(ValueError, match="nulls"):
        bool_values(pa.array([True, None]))


def test_succeeded_is_null_or_empty_error():
    errors = pa.chunked_array([pa.array(["x", None, "", "timeout"])[1:], pa.array([None, "boom"])])
    assert succeeded(errors).tolist() == [True, True, False, True, False]


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_succeeded_reads_offsets_and_validity_as_pyarrow_compute_does(arrow_type):
    """Read from the buffers (sliced chunks, all-null and null-free ones), against pyarrow's kernels."""
    import pyarrow.compute as pc

    rng = np.random.default_rng(5)
    for _ in range(300):
        values = [None if rng.random() < 0.3 else "" if rng.random() < 0.3 else "e" * int(rng.integers(1, 4))
                  for _ in range(int(rng.integers(0, 30)))]
        if arrow_type in (pa.binary(), pa.large_binary()):
            values = [None if v is None else v.encode() for v in values]
        whole = pa.array(values, type=arrow_type)
        for chunk in (whole, whole[3:], whole[2:-4], pa.nulls(len(values), arrow_type)):
            expected = pc.or_kleene(pc.is_null(chunk), pc.equal(pc.binary_length(chunk), 0)).to_pylist()
            assert succeeded(chunk).tolist() == expected


def test_a_simulated_run_and_its_report_import_no_pandas(tmp_path):
    # pyarrow imports pandas on its first conversion of Python values or to NumPy: a third of a
    # second in every run worker and in the report's process, none of which uses pandas
    script = textwrap.dedent(f"""
        import sys
        from functools import lru_cache
        from pathlib import Path
        from loadgen.core.spec import load_spec
        from loadgen.core.runner import run_keys, run_simulated
        from loadgen.analysis import write_summary
        from loadgen.analysis.runs import load_run
        from loadgen.analysis.figures import figure_jobs
        from loadgen.analysis.latency_figures import latency_figure_jobs
        spec = load_spec({str(ROOT / "examples" / "paired-burst.yaml")!r})
        spec = spec.model_copy(update={{"duration_s": 1800.0}})
        out = Path({str(tmp_path)!r})
        keys = [k for k in run_keys(spec) if k.seed == 501]
        for key in keys:
            run_simulated(spec, key, out)
        load = lru_cache(maxsize=None)(load_run)
        summary = write_summary(out, load)
        for _, draw in latency_figure_jobs(out, summary, load) + figure_jobs(out, summary, load):
            draw()
        print(sorted(m for m in sys.modules if m == "pandas" or m.startswith("pandas.")))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"

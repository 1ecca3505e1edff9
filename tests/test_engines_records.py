"""TurnRequest and TurnResult: frozen dataclasses, extension types when compiled (loadgen/core/engines.py)."""

import dataclasses
import math
import pickle

import pytest

from loadgen.core.engines import TurnRequest, TurnResult


@pytest.mark.parametrize("record", [TurnRequest, TurnResult])
def test_positional_arguments_fill_the_fields_in_order_and_the_rest_take_their_defaults(record):
    fields = dataclasses.fields(record)
    required = [f for f in fields if f.default is dataclasses.MISSING]
    values = [f"v{i}" for i in range(len(required) + 2)]
    made = record(*values)
    for i, field in enumerate(fields):
        got = getattr(made, field.name)
        if i < len(values):
            assert got == values[i], field.name
        else:
            assert got == field.default or (math.isnan(got) and math.isnan(field.default)), field.name


def test_a_record_is_frozen_comparable_hashable_and_replaceable():
    result = TurnResult(1.0, 2.0, 3.0, 100, 50, 10, error="x")
    assert result.error == "x" and result.num_preemptions == 0 and math.isnan(result.itl_mean_s)
    with pytest.raises(AttributeError):  # FrozenInstanceError in pure Python, a read-only slot compiled
        result.finish_s = 4.0
    moved = dataclasses.replace(result, replica=2)
    assert moved.replica == 2 and moved.finish_s == 3.0 and result.replica is None
    request = TurnRequest(7, 0, 100, 10, final=True)
    assert request == TurnRequest(7, 0, 100, 10, final=True) and hash(request) == hash(TurnRequest(7, 0, 100, 10, final=True))
    assert request != TurnRequest(7, 1, 100, 10, final=True) and request != (7, 0, 100, 10)
    assert dataclasses.asdict(request)["prefix_key"] == "system"
    assert pickle.loads(pickle.dumps(request)) == request


def test_records_compare_as_tuples_of_their_fields_as_a_dataclass_does():
    # the default NaN is one object: equal records holding it are equal (Cython's own __eq__
    # compares field by field, where NaN != NaN); a NaN made elsewhere is not equal
    assert TurnResult(1.0, 2.0, 3.0, 100, 50, 10) == TurnResult(1.0, 2.0, 3.0, 100, 50, 10)
    assert TurnResult(1.0, 2.0, 3.0, 100, 50, 10) != TurnResult(1.0, 2.0, 3.0, 100, 50, 10, itl_mean_s=float("nan"))
    assert len({TurnResult(1.0, 2.0, 3.0, 100, 50, 10), TurnResult(1.0, 2.0, 3.0, 100, 50, 10)}) == 1

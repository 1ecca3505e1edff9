"""TurnRequest and TurnResult: frozen dataclasses with an __init__ of their own (loadgen/core/engines.py)."""

import dataclasses
import inspect
import math

import pytest

from loadgen.core.engines import TurnRequest, TurnResult


@pytest.mark.parametrize("record", [TurnRequest, TurnResult])
def test_init_takes_exactly_the_fields_in_order_with_their_defaults(record):
    params = list(inspect.signature(record.__init__).parameters.values())[1:]
    fields = dataclasses.fields(record)
    assert [p.name for p in params] == [f.name for f in fields]
    for param, field in zip(params, fields):
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert param.default == default or (isinstance(default, float) and math.isnan(default)
                                            and math.isnan(param.default)), field.name


def test_a_record_is_frozen_comparable_and_replaceable():
    result = TurnResult(1.0, 2.0, 3.0, 100, 50, 10, error="x")
    assert result.error == "x" and result.num_preemptions == 0 and math.isnan(result.itl_mean_s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.finish_s = 4.0
    moved = dataclasses.replace(result, replica=2)
    assert moved.replica == 2 and moved.finish_s == 3.0 and result.replica is None
    request = TurnRequest(7, 0, 100, 10, final=True)
    assert request == TurnRequest(7, 0, 100, 10, final=True) and hash(request) == hash(TurnRequest(7, 0, 100, 10, final=True))
    assert request != TurnRequest(7, 1, 100, 10, final=True)
    assert dataclasses.asdict(request)["prefix_key"] == "system"
